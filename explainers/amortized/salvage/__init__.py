"""Salvage (Naouar et al., ICLR 2025): amortized Shapley explainers of image classifiers.

`train.py`: the surrogate and explainer networks and their training; `inference.py`: a trained
explainer at work; `explainer.py`: Salvage artifacts in the store and the `salvage` explainer.
"""
