"""Every relative link and image in the project's Markdown resolves.

Pages: README.md, CHANGELOG.md, docs/**/*.md, configs/**/README.md and
benchmarks/README.md. A link ``[text](target)`` or image ``![alt](target)``
outside code blocks whose target is not a URL must name an existing file or
folder, relative to the page; a ``#anchor`` into a Markdown page must name one of
its headings, slugged as GitHub does.
"""
import glob
import os.path as osp
import re

import pytest

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PAGES = sorted(
    [osp.join(REPO, 'README.md'), osp.join(REPO, 'CHANGELOG.md'),
     osp.join(REPO, 'benchmarks', 'README.md')]
    + glob.glob(osp.join(REPO, 'docs', '**', '*.md'), recursive=True)
    + glob.glob(osp.join(REPO, 'configs', '**', 'README.md'), recursive=True))

LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
FENCE = re.compile(r'^(```|~~~).*?^\1', re.M | re.S)
INLINE_CODE = re.compile(r'`[^`\n]*`')


def _prose(text: str) -> str:
    """The page without fenced code blocks and inline code spans."""
    return INLINE_CODE.sub('', FENCE.sub('', text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    heading = INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading.strip())
    heading = re.sub(r'[^\w\- ]', '', heading.lower())
    return heading.replace(' ', '-')


def _anchors(path: str) -> set:
    with open(path, encoding='utf-8') as f:
        text = FENCE.sub('', f.read())
    return {_slug(h) for h in re.findall(r'^#{1,6}\s+(.*?)\s*#*\s*$', text, re.M)}


def _targets(page: str) -> list:
    with open(page, encoding='utf-8') as f:
        return LINK.findall(_prose(f.read()))


def test_pages_are_found():
    names = {osp.relpath(p, REPO) for p in PAGES}
    assert {'README.md', 'docs/dino.md', 'configs/dino/README.md'} <= names


def test_slug_follows_github():
    assert _slug('Use DinoVim in your own mmseg / mmdet config') == \
        'use-dinovim-in-your-own-mmseg--mmdet-config'
    assert _slug('Results on the H200 (2026-12-03)') == 'results-on-the-h200-2026-12-03'
    assert _slug('The SSD op: `ssd_scan`') == 'the-ssd-op-ssd_scan'


@pytest.mark.parametrize('page', PAGES, ids=lambda p: osp.relpath(p, REPO))
def test_relative_links_and_images_resolve(page):
    broken = []
    for target in _targets(page):
        if re.match(r'^[a-z][a-z0-9+.-]*:', target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition('#')
        resolved = osp.normpath(osp.join(osp.dirname(page), path)) if path else page
        if not osp.exists(resolved):
            broken.append(f'{target}: no such file')
        elif anchor and resolved.endswith('.md') and anchor not in _anchors(resolved):
            broken.append(f'{target}: no heading with anchor #{anchor}')
    assert not broken, f'{osp.relpath(page, REPO)}: ' + '; '.join(broken)


def test_every_figure_in_docs_images_is_shown():
    """Each PNG under docs/images/ appears as an image on some page."""
    shown = set()
    for page in PAGES:
        for target in _targets(page):
            shown.add(osp.normpath(osp.join(osp.dirname(page), target.partition('#')[0])))
    figures = glob.glob(osp.join(REPO, 'docs', 'images', '**', '*.png'), recursive=True)
    assert figures
    unshown = sorted(osp.relpath(f, REPO) for f in figures if osp.normpath(f) not in shown)
    assert not unshown, f'figures no page shows: {unshown}'


def test_no_dated_narrative_in_readme_docs_configs():
    """Reference pages and configs carry no diary: no 'round', 'stop N', 'tonight'."""
    pattern = re.compile(r'\bround\b|stop [0-9]|tonight|\(night\)')
    files = [osp.join(REPO, 'README.md')] + [
        f for top in ('docs', 'configs')
        for f in glob.glob(osp.join(REPO, top, '**', '*'), recursive=True)
        if osp.isfile(f) and f.endswith(('.md', '.py', '.yml'))]
    hits = []
    for path in files:
        with open(path, encoding='utf-8') as f:
            for number, line in enumerate(f, 1):
                if pattern.search(line):
                    hits.append(f'{osp.relpath(path, REPO)}:{number}: {line.strip()}')
    assert not hits, '\n'.join(hits)


CONFIG_FOLDERS = sorted(
    d for d in glob.glob(osp.join(REPO, 'configs', '*'))
    if osp.isdir(d) and osp.basename(d) != '_base_')


@pytest.mark.parametrize('folder', CONFIG_FOLDERS, ids=osp.basename)
def test_config_folder_readme_has_the_model_zoo_form(folder):
    """mmpretrain's form: the paper, how to use it, a results table, a citation;
    every config of the folder appears in the README's links."""
    with open(osp.join(folder, 'README.md'), encoding='utf-8') as f:
        text = f.read()
    assert re.search(r'^> \[.+\]\(https://arxiv\.org/abs/\d{4}\.\d{5}\)', text, re.M)
    headings = re.findall(r'^## (.+)$', text, re.M)
    assert headings[:2] == ['Abstract', 'How to use it'], headings
    assert headings[-2:] == ['Models and results', 'Citation'], headings
    header = re.search(r'^\| Model \| .*Params.* \| .*FLOPs.* \|.* Config.* \| Download \|$',
                       text, re.M)
    assert header, 'results table must read Model | Params | FLOPs | ... | Config | Download'
    assert '```bibtex' in text
    linked = {osp.normpath(osp.join(folder, t)) for t in LINK.findall(_prose(text))}
    leaves = [f for f in glob.glob(osp.join(folder, '**', '*.py'), recursive=True)
              if '_base_' not in osp.relpath(f, folder).split(osp.sep)]
    unlinked = sorted(osp.relpath(f, REPO) for f in leaves if osp.normpath(f) not in linked)
    assert not unlinked, f'configs the README does not list: {unlinked}'
