"""The `shapley` explainer family: Shapley values and interaction indices of a model's outputs.

`explainer.py`: options and `explain` (Shapley 1953; KernelSHAP, Lundberg & Lee 2017);
`runs.py`: one index per instance (the game, the request's estimator choice, the outputs);
`trees.py`: exact TreeSHAP on tree models (Lundberg et al. 2020). The indices' estimators
(SV; interaction indices SII, k-SII, STII, FSII, FBII; aggregated positive interactions, Chang,
Lee & Choi, ICLR 2025) are rows of the estimator table, explainers/estimators/registry.py.
"""
