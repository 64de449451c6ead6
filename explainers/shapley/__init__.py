"""The `shapley` explainer family: Shapley values and interaction indices of a model's outputs.

`explainer.py`: options and `explain` (Shapley 1953; KernelSHAP, Lundberg & Lee 2017);
`runs.py`: one index per instance (the game, an estimator, the outputs); `trees.py`: exact
TreeSHAP on tree models (Lundberg et al. 2020); `interactions.py`: interaction indices (SII,
k-SII, STII, FSII, FBII); `api_allocation.py`: aggregated positive interactions (Chang, Lee &
Choi, ICLR 2025).
"""
