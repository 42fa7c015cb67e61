"""SGLang side of SPECSOT: the algorithm, its input types, drafters and the spec-V2 worker."""
