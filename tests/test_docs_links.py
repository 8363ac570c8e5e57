"""Every relative link and image in the project's Markdown resolves.

Pages: README.md, CHANGELOG.md, docs/**/*.md, configs/**/README.md and
benchmarks/README.md. A link ``[text](target)`` or image ``![alt](target)``
outside code blocks whose target is not a URL must name an existing file or
folder, relative to the page; a ``#anchor`` into a Markdown page must name one of
its headings, slugged as GitHub does.

And no file of the repository points outside it: a user's clone has nothing beside
it, so no test, doc, config or tool may name the development workspace's folder
beside the checkout or its private notes (:data:`OUTSIDE`).
"""
import glob
import os
import os.path as osp
import re
import subprocess

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


# a work session's diary: reference pages say what is measured now, with the command
SESSION_DIARY = r"\b(?:this|that) session\b|one commit earlier|\btoday'?s?\b"


def test_no_dated_narrative_in_readme_docs_configs():
    """Reference pages and configs carry no diary: no 'round', 'stop N', 'tonight',
    no 'this session' or 'today'. benchmarks/README.md, whose ``--rounds`` are a
    term of the tool, is read for the session diary only."""
    pattern = re.compile(r'\bround\b|stop [0-9]|tonight|\(night\)|' + SESSION_DIARY)
    files = [osp.join(REPO, 'README.md')] + [
        f for top in ('docs', 'configs')
        for f in glob.glob(osp.join(REPO, top, '**', '*'), recursive=True)
        if osp.isfile(f) and f.endswith(('.md', '.py', '.yml'))]
    checks = [(path, pattern) for path in files] + [
        (osp.join(REPO, 'benchmarks', 'README.md'), re.compile(SESSION_DIARY))]
    hits = []
    for path, words in checks:
        with open(path, encoding='utf-8') as f:
            for number, line in enumerate(f, 1):
                if words.search(line):
                    hits.append(f'{osp.relpath(path, REPO)}:{number}: {line.strip()}')
    assert not hits, '\n'.join(hits)


def test_the_diary_pattern_finds_a_diary():
    """The session-diary words match the lines they were written against."""
    words = re.compile(SESSION_DIARY)
    for line in ("not reached in that session's device time",
                 "the CSV files give them with today's path",
                 'the times were taken one commit earlier'):
        assert words.search(line), line
    assert not words.search('the device time of a call; a session of the recipe')


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


# What a file of the repository must not name: the workspace folder beside the
# checkout (a parent-relative "shared" folder, its fixtures folder) and the
# workspace's notes. Spelled in pieces so that this file does not match itself.
OUTSIDE = re.compile('|'.join([
    r'\.\.[/\\]+' + 'shared' + r'\b',
    r'\b' + 'shared' + r'[/\\]+' + 'fixtures' + r'\b',
    r'\b(?:' + '|'.join(['DE' + 'SIGN', 'ML' + 'LA', 'ST' + 'YLE']) + r')\.md\b',
    r'''['"]\.\.['"]\s*,\s*['"]''' + 'shared' + r'''['"]''',  # osp.join(.., '..', ...)
]).encode())
# folders a checkout may hold that are not part of the repository (.gitignore; and
# the top-level data/)
UNTRACKED = {'.git', '.venv', 'work_dirs', 'build', '.whl', '__pycache__',
             '.pytest_cache'}


def _repository_files() -> list:
    """The tracked files (``git ls-files``); without git (an unpacked source
    archive), every file outside the ignored folders."""
    if osp.isdir(osp.join(REPO, '.git')):
        try:
            out = subprocess.run(['git', 'ls-files', '-z'], cwd=REPO, check=True,
                                 capture_output=True).stdout
            return [osp.join(REPO, p) for p in out.decode().split('\0') if p]
        except (OSError, subprocess.CalledProcessError):
            pass
    files = []
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in UNTRACKED and not d.endswith('.egg-info')
                   and not (root == REPO and d == 'data')]
        files += [osp.join(root, n) for n in names]
    return files


def outside_references(paths) -> list:
    """``path:line: text`` of every line of ``paths`` that :data:`OUTSIDE` matches
    (binary files too: a pickled path counts)."""
    hits = []
    for path in paths:
        if not osp.isfile(path):
            continue
        with open(path, 'rb') as f:
            data = f.read()
        for match in OUTSIDE.finditer(data):
            line = data.count(b'\n', 0, match.start()) + 1
            hits.append(f'{osp.relpath(path, REPO)}:{line}: '
                        f'{match.group(0).decode(errors="replace")}')
    return hits


def test_no_file_points_outside_the_repository():
    files = _repository_files()
    assert osp.join(REPO, 'README.md') in files and len(files) > 100
    hits = outside_references(files)
    assert not hits, ('files that name something outside the repository (a clone has '
                      'nothing beside it; put what they need under the repository, '
                      'e.g. tests/data/):\n' + '\n'.join(hits))


def test_outside_references_are_caught(tmp_path):
    """The check finds each form, in text and in a binary file, and passes the
    repository's own names (docs/mlla.md, tests/data/)."""
    forms = ['../' + 'shared/' + 'fixtures/x.pt', '..\\' + 'shared',
             'see DE' + 'SIGN.md', 'MLLA' + '.md section 5', '(STY' + 'LE.md)',
             "osp.join(REPO, '..', " + "'shared', 'fixtures')"]
    for number, form in enumerate(forms):
        path = tmp_path / f'{number}.txt'
        path.write_text(f'first line\nthe text {form} here\n')
        found = OUTSIDE.search(form.encode()).group(0).decode()
        assert outside_references([str(path)]) == [
            f'{osp.relpath(str(path), REPO)}:2: {found}']
    binary = tmp_path / 'b.pt'
    binary.write_bytes(b'\x80\x02' + ('../' + 'shared/x').encode() + b'\x00')
    assert len(outside_references([str(binary)])) == 1
    clean = tmp_path / 'clean.md'
    clean.write_text('docs/mlla.md, tests/data/official_mlla_small.pt, shared_memory, '
                     'the shared toy generator\n')
    assert outside_references([str(clean)]) == []
