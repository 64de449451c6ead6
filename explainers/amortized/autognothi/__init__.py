"""AutoGnothi (Wang et al., ICLR 2025): a side network beside a frozen transformer that outputs
word Shapley values in the model's own forward pass.

`net.py`: the side network and the frozen-encoder pass; `train.py`: training with FastSHAP's
objective; `corpus.py`: training sentences from the VADER lexicon; `explainer.py`: AutoGnothi
artifacts and the `autognothi` explainer; `image.py`: a library experiment on digits-cnn.
"""
