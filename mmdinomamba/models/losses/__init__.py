from .dino_loss import DINOLoss

__all__ = ['DINOLoss']
