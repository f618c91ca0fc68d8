"""Draft models for speculative decoding: trained heads committed with the code (``heads/``)
and the stages that build them (``hf_stages.py``, run as a script where torch lives)."""
