"""mmdinomamba: visual Mamba models as first-class citizens of OpenMMLab.

The numerical core (``mmdinomamba.ops``, ``mmdinomamba.models.mixers``,
``mmdinomamba.models.backbones``) needs only torch, einops and mmengine; the
OpenMMLab packages are needed for the registries, configs and tools. The exact
versions that work together here are installed by ``tools/setup/install.sh``.
"""
from setuptools import find_packages, setup

setup(
    name='mmdinomamba',
    version='0.1.0',
    description='DinoVim, LinearViT, SSD mixers, DINO and Binary-AUC for OpenMMLab',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.9',
    packages=find_packages(include=['mmdinomamba', 'mmdinomamba.*']),
    install_requires=[
        'torch>=2.1',
        'einops>=0.7',
        'mmengine>=0.10.0,<0.11',
        'numpy',
    ],
    extras_require={
        # The OpenMMLab stack that the registries, configs and tools plug into.
        'openmmlab': [
            'mmcv==2.1.0',
            'mmpretrain==1.2.0',
            'mmsegmentation==1.2.2',
            'mmdet==3.3.0',
            'ftfy',
            'regex',
        ],
        'tests': [
            'pytest>=7',
            'scikit-learn',
            'matplotlib',
        ],
        # Optional fused GPU kernels (CUDA machines only).
        'mamba': ['mamba-ssm>=2.2'],
    },
)
