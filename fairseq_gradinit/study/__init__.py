"""The study runner's pure-Python pieces (no torch, no fairseq): tables of a finished study."""
