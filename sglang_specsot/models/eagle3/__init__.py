"""Training an EAGLE-3 draft head on the CPU for a target the project ships
(`python -m sglang_specsot.models train-eagle3 TARGET`): the target's own answers to a
shipped prompt set, its captured hidden states, a compact trainer following EAGLE-3's recipe
(three target layers, training-time test, a reduced draft vocabulary), and an export SGLang
serves as `LlamaForCausalLMEagle3`."""
