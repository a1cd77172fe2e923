"""Building blocks shared by the model families: parallel linears, norms, rope, MLP, MoE, decoder."""
