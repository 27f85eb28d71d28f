# Table 2, "Dynamic Linear 1 + DWC" (Bilateral + Adaptive, eqs. 8 and 11): the released layers on Table 2's
# 18-block trunk (arch 't18', one more static block than WeightFormer-T; docs/weightformer.md says why). The base of
# every Table 2 row; Tables 3 and 6 use the 17-block WeightFormer-T.
_base_ = './weightformer_t_in1k.py'

model = dict(backbone=dict(arch='t18'))
