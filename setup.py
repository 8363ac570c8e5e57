"""mmdinomamba: visual Mamba models as first-class citizens of OpenMMLab.

The numerical core (``mmdinomamba.ops``, ``mmdinomamba.models.mixers``,
``mmdinomamba.models.backbones``) needs only torch, einops and mmengine; the
OpenMMLab packages are needed for the registries, configs and tools. The exact
versions that work together here are installed by ``tools/setup/install.sh``.

The configs and ``model-index.yml`` travel with the package, as OpenMMLab packages
ship theirs: a wheel (``pip install .``) carries copies under ``mmdinomamba/.mim/``;
an editable install (``pip install -e .``) reads the checkout's own, beside the
package (``mmdinomamba.zoo.package_root`` finds either).
"""
import os
import os.path as osp
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# shipped under mmdinomamba/.mim/ in a wheel (and in the sdist, see MANIFEST.in)
MIM_FILES = ('configs', 'model-index.yml')


class BuildWithConfigs(build_py):
    """``build_py`` that also copies :data:`MIM_FILES` into ``mmdinomamba/.mim/``
    of the build (not in an editable build: that one reads the checkout)."""

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):
            return
        root = osp.dirname(osp.abspath(__file__))
        mim = osp.join(self.build_lib, 'mmdinomamba', '.mim')
        for name in MIM_FILES:
            src, dst = osp.join(root, name), osp.join(mim, name)
            if osp.isdir(src):
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(src, dst,
                                ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
            else:
                os.makedirs(mim, exist_ok=True)
                shutil.copy2(src, dst)

setup(
    name='mmdinomamba',
    version='0.1.0',
    description='DinoVim, LinearViT, SSD mixers, DINO and Binary-AUC for OpenMMLab',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.9',
    packages=find_packages(include=['mmdinomamba', 'mmdinomamba.*']),
    cmdclass={'build_py': BuildWithConfigs},
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
            'pytest-xdist',
            'scikit-learn',
            'matplotlib',
            'modelindex',
        ],
        # Optional fused GPU kernels (CUDA machines only).
        'mamba': ['mamba-ssm>=2.2'],
    },
)
