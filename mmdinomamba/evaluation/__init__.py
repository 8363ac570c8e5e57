"""Evaluation metrics (torch + mmengine only)."""
from .binary_auc import (BinaryAUC, binary_auc, binary_auc_batch, foreground_mask,
                         roc_curve, threshold_error_bound)
from .bootstrap import BootstrapCI, bootstrap_ci, bootstrap_means
from .knn import knn_accuracy, knn_classify

__all__ = [
    'BinaryAUC', 'binary_auc', 'binary_auc_batch', 'foreground_mask', 'roc_curve',
    'threshold_error_bound', 'BootstrapCI', 'bootstrap_ci', 'bootstrap_means',
    'knn_accuracy', 'knn_classify'
]
