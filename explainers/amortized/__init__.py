"""Amortized explainers: networks trained once per model that answer in one forward pass.

`store.py`: the generic artifact store (trained networks of one model version in the model
store) and the `Trainable` protocol; `progress.py`: a trainer's progress records; `masks.py`:
the coalition samplers training draws from. Families: `salvage/` (Naouar et al., ICLR 2025) and
`autognothi/` (Wang et al., ICLR 2025), both with FastSHAP's objective (Jethani et al., 2022).
"""
