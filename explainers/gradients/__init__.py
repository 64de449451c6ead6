"""Path attributions: integrated gradients (Sundararajan, Taly & Yan 2017) and their baselines.

`integrated.py`: IG and expected gradients from static or sampled baselines, re-calibrated path
estimators (Yang et al., ICLR 2023); `integrated_text.py`: IG of text classifiers on their input
embeddings; `uni.py` and `uni_text.py`: UNI's unlearning-based baselines (Choi, Duplessis &
Belongie, ICLR 2025); `learned_baseline.py`: learned absence values (Ren et al., ICLR 2023).
"""
