# The transfer study's Random row for DeiT-B with TTT attention: the ImageNet-1K experiment of
# configs/imagenet/deit_b_ttt_in1k.py (no transfer), with the study's softmax DeiT-B (its checkpoint, the
# distillation teacher) for the rows that inherit this one.
_base_ = ['../imagenet/deit_b_ttt_in1k.py', '../_base_/deit_b_softmax_teacher.py']
