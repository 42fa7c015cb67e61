"""SPECSOT's budget policy: how many tokens each request drafts in a step, from measured costs
and acceptance. Plain Python: no torch, no SGLang (tests/unit/test_purity.py), so it runs and
is tested alike on every device.
"""
