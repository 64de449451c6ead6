"""How far to trust an answer: generic caveats on every explanation (`caveats.py`), the audit of
a user-supplied background (`audit.py`, Laberge et al., ICLR 2023) and faithfulness and
stability metrics (`evaluation.py`: deletion/insertion, MuFidelity, max-sensitivity)."""
