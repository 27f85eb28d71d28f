# WF-DiT-S/2 trained on the images themselves, encoded by the VAE at every step (DiT's train.py; the cached-latent
# configs give the same data, faster).
_base_ = './wf_dit_s_2_in256.py'

train_dataloader = dict(dataset=dict(_delete_=True, type='ClassFolderImages', root='data/imagenet/train', size=256))
