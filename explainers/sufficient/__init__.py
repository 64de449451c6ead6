"""Minimal sufficient subsets: the fewest players that, kept with the rest absent, keep the class.

`explainer.py`: options and `explain`; `search.py`: exact and greedy searches and the criterion.
"""
