"""One module or subpackage per public op (its name is the op's): add_mul, softmax, layer_norm,
softmax_matmul, attention, matmul_softmax, linear_act, linear_cross_entropy."""
