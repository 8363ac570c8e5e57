"""Evaluation metrics (torch + mmengine only)."""
from .binary_auc import (BinaryAUC, binary_auc, foreground_mask, roc_curve,
                         threshold_error_bound)

__all__ = [
    'BinaryAUC', 'binary_auc', 'foreground_mask', 'roc_curve',
    'threshold_error_bound'
]
