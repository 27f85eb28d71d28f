# The transfer study's Random row for DeiT-B with ReLU attention: the ImageNet-1K experiment of
# configs/imagenet/deit_b_relu_in1k.py (no transfer), with the study's softmax DeiT-B (its checkpoint, the
# distillation teacher) for the rows that inherit this one.
_base_ = ['../imagenet/deit_b_relu_in1k.py', '../_base_/deit_b_softmax_teacher.py']
