"""Speculative decoding: draft tokens cheaply (DeepSeek's MTP layer, or n-gram prompt lookup), then
verify them all in one forward pass of the target model, keeping its output distribution exactly."""
