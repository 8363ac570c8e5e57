"""The shrunk dense heads the dense tests train: ``--cfg-options`` keys for the
necks and heads of the UperNet and Cascade / Mask R-CNN configs at a tiny width
(the backbone and data keys stay with each test)."""
from typing import Dict, Optional, Sequence


def upernet_head_options(width: int) -> Dict[str, object]:
    """UperNet (with its auxiliary FCN head) on ``width`` channels, trained on 64 px
    crops and evaluated in 72 px sliding windows."""
    return {'model.neck.embed_dim': width,
            'model.decode_head.in_channels': [width] * 4,
            'model.decode_head.channels': width,
            'model.auxiliary_head.in_channels': width,
            'model.auxiliary_head.channels': width // 2,
            'model.data_preprocessor.size': (64, 64),
            'model.test_cfg.crop_size': (72, 72),
            'model.test_cfg.stride': (48, 48)}


def upernet_pyramid_head_options(widths: Sequence[int], width: int) -> Dict[str, object]:
    """UperNet straight on a hierarchical backbone's four stages (``widths``
    channels; no neck), the auxiliary head on the third, at ``width`` channels,
    trained on 64 px crops."""
    return {'model.decode_head.in_channels': list(widths),
            'model.decode_head.channels': width,
            'model.auxiliary_head.in_channels': widths[2],
            'model.auxiliary_head.channels': width // 2,
            'model.data_preprocessor.size': (64, 64)}


def two_stage_head_options(width: int, num_classes: int, stages: Sequence[str],
                           in_widths: Optional[Sequence[int]] = None
                           ) -> Dict[str, object]:
    """The heads at ``width`` channels with ``num_classes`` classes and small
    proposal and sampling budgets; ``stages``: the key suffixes of the bbox heads
    (``'.0'``, ``'.1'``, ... for Cascade R-CNN's list, ``''`` for one head). The
    neck: Feature2Pyramid then FPN over four ``width`` maps (a plain backbone), or
    with ``in_widths`` one FPN over a hierarchical backbone's four stages."""
    if in_widths is None:
        opts = {'model.neck.0.embed_dim': width,
                'model.neck.1.in_channels': [width] * 4,
                'model.neck.1.out_channels': width}
    else:
        opts = {'model.neck.in_channels': list(in_widths),
                'model.neck.out_channels': width}
    opts.update({
        'model.rpn_head.in_channels': width,
        'model.rpn_head.feat_channels': width,
        'model.roi_head.bbox_roi_extractor.out_channels': width,
        'model.roi_head.mask_roi_extractor.out_channels': width,
        'model.roi_head.mask_head.in_channels': width,
        'model.roi_head.mask_head.conv_out_channels': width,
        'model.roi_head.mask_head.num_classes': num_classes,
        'model.train_cfg.rpn.sampler.num': 32,
        'model.train_cfg.rpn_proposal.nms_pre': 200,
        'model.train_cfg.rpn_proposal.max_per_img': 100,
        'model.test_cfg.rpn.nms_pre': 200,
        'model.test_cfg.rpn.max_per_img': 50,
        # an untrained head scores about 1 / (classes + 1): keep every box so
        # that the metrics have detections to match
        'model.test_cfg.rcnn.score_thr': 0.0,
        'model.test_cfg.rcnn.max_per_img': 20,
    })
    for stage in stages:
        opts.update({f'model.roi_head.bbox_head{stage}.num_classes': num_classes,
                     f'model.roi_head.bbox_head{stage}.in_channels': width,
                     f'model.roi_head.bbox_head{stage}.fc_out_channels': 2 * width,
                     f'model.train_cfg.rcnn{stage}.sampler.num': 32})
    return opts
