"""The formats users bring, each loaded and run in a model worker process (models/sandbox/).

`user.py` builds a registered model from its declaration and files: TorchScript (checked by
`torchscript_check.py`), ONNX (`onnx.py`, `onnx_text.py`), XGBoost and LightGBM boosters
(`trees.py`, checked by `booster_check.py`, `booster_ubjson.py`, `lightgbm_check.py`), Hugging
Face checkpoints (`hf.py`, `hf_models.py`, `checkpoint.py`) and remote Open Inference Protocol
endpoints (`remote*.py`); `archive.py` unpacks uploads safely, `facts.py` reads what a file
states about itself.
"""
