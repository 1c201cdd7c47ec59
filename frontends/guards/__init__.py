"""Guards: what a forward does that the captured graph cannot replay, refused or kept on request.

The graph replays tensor ops only; Python state changed in forward (`forward_state`), module and
tensor hooks (`forward_hooks`), draws from Python's and numpy's generators and reseeding
(`rng_states`), custom ``torch.autograd.Function`` backwards (`custom_functions`) and FSDP units
inside the model (`sharding`) are checked around a capture (`forward_guards`), each named at the
user's file:line (`user_code`); Hugging Face models get their generation cache switched off for
the training step and their unsupported constructs explained (`hf_training`).
"""
