"""The shipped models and their trainers (the catalog that names them: models/catalog.py).

`trained.py`: diabetes-mlp, breast-cancer-mlp, digits-cnn on sklearn datasets (`datasets.py`),
trained once and cached (`training.py`); `sst.py`: digits-sst; `text.py`: sentiment-minilm over
`bert.py`; `encoders.py`; `rankers.py`; `lm.py` and `lm_cache.py`: the causal LMs.
"""
