# The DinoMamba-Reg-B linear probe tested on ImageNet val with the ReaL labels.
_base_ = ['../linear_probe/dinomamba-reg-base-p16_4xb128-linear-coslr-100e_in1k.py',
          '_base_/in-real.py']
test_dataloader = dict(dataset=dict(
    _delete_=True, **_base_.robustness_dataset,
    pipeline=_base_.test_dataloader.dataset.pipeline))
test_evaluator = dict(_delete_=True, **_base_.robustness_evaluator)
