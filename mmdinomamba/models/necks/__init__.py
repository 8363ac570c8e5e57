from .concat_neck import ConcatNeck

__all__ = ['ConcatNeck']
