"""The rendered book, as a reader gets it: run by `make test-report` after `make render` (which
sets RENDERED_OUTPUT to the output folder); skipped in a plain `make test`, which renders nothing.

Every chapter has its HTML page; every local link and image resolves to a file of the output;
no cross-reference is left unresolved (Quarto prints `?@fig-...`) in the HTML or the PDF; the one
PDF holds every chapter's title; every figure is a non-empty file."""
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import yaml

from qmd import chapters

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = Path(os.environ["RENDERED_OUTPUT"]) if os.environ.get("RENDERED_OUTPUT") else None
pytestmark = pytest.mark.skipif(OUTPUT is None, reason="run through `make test-report`, which "
                                "renders the book first")
CHAPTERS = chapters(ROOT)
UNRESOLVED = re.compile(r"\?@(fig|tbl|sec)-[\w-]+")


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[tuple[str, str]] = []
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.refs.append((tag, value))
            if tag == "img" and name == "src" and value:
                self.images.append(value)


def _pages() -> list[Path]:
    return sorted(p for p in OUTPUT.rglob("*.html") if "site_libs" not in p.parts)


def _page(qmd: Path) -> Path:
    """A chapter's HTML page: index.qmd -> index.html, report/x.qmd -> report/x.html."""
    return OUTPUT / qmd.relative_to(ROOT).with_suffix(".html")


def _parse(page: Path) -> _Links:
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def _title(qmd: Path) -> str:
    """A chapter's title as its first heading writes it, without its attributes and markup."""
    heading = next(line for line in qmd.read_text().splitlines() if line.startswith("# "))
    return re.sub(r"\s*\{.*\}\s*$", "", heading[2:]).replace("`", "").strip()


def _pdf_text(pdf: Path) -> str:
    if shutil.which("pdftotext"):
        return subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True,
                              text=True, check=True).stdout
    from pypdf import PdfReader

    return "\n".join(page.extract_text() or "" for page in PdfReader(pdf).pages)


def _pdf() -> Path:
    config = yaml.safe_load((ROOT / "_quarto.yml").read_text())
    return OUTPUT / f"{config['book']['output-file']}.pdf"


def test_every_chapter_has_its_page():
    assert (OUTPUT / "index.html").is_file()
    for qmd in CHAPTERS:
        assert _page(qmd).is_file(), f"{_page(qmd)} was not rendered"


def test_local_links_and_images_resolve():
    broken = []
    for page in _pages():
        for tag, ref in _parse(page).refs:
            url = urlparse(ref)
            if url.scheme or ref.startswith(("#", "//", "mailto:", "data:")):
                continue
            target = (page.parent / unquote(url.path)).resolve()
            if not target.exists():
                broken.append(f"{page.name}: <{tag}> {ref}")
    assert not broken, "\n".join(broken[:20])


def test_no_unresolved_cross_references_in_html():
    for page in _pages():
        hits = UNRESOLVED.findall(page.read_text(encoding="utf-8"))
        assert not hits, f"{page.name}: unresolved {hits[:5]}"


def test_one_pdf_with_every_chapter_and_no_unresolved_reference():
    pdf = _pdf()
    assert pdf.is_file() and pdf.stat().st_size > 100_000, f"{pdf} missing or empty"
    text = _pdf_text(pdf)
    flat = re.sub(r"\s+", " ", text)
    for qmd in CHAPTERS:
        title = _title(qmd)
        assert re.sub(r"\s+", " ", title) in flat, f"the PDF lacks the chapter '{title}'"
    hits = UNRESOLVED.findall(text)
    assert not hits, f"the PDF has unresolved cross-references: {hits[:5]}"
    assert "nan TB/s" not in flat and "nan ms" not in flat
    assert "′" not in flat, "a prime where an apostrophe was meant (typst after a digit: GPT-2's)"


def test_every_figure_image_exists_and_is_not_empty():
    from qmd import cells

    for qmd in CHAPTERS:
        page = _page(qmd)
        images = _parse(page).images
        for label in (c.options["label"] for c in cells(qmd.read_text())
                      if str(c.options.get("label", "")).startswith("fig-")):
            srcs = [s for s in images if f"/{label}-output" in s]
            assert srcs, f"{page.name}: no image for {label}"
    for page in _pages():
        for src in _parse(page).images:
            if urlparse(src).scheme or src.startswith("data:"):
                continue
            path = page.parent / unquote(urlparse(src).path)
            assert path.is_file() and path.stat().st_size > 1000, f"{page.name}: {src} is empty"


def _pdf_pages() -> list[str]:
    """The PDF's text, page by page."""
    if shutil.which("pdftotext"):
        text = subprocess.run(["pdftotext", "-layout", str(_pdf()), "-"], capture_output=True,
                              text=True, check=True).stdout
        return text.split("\f")[:-1] if text.endswith("\f") else text.split("\f")
    from pypdf import PdfReader

    return [page.extract_text() or "" for page in PdfReader(_pdf()).pages]


MAX_PAGES = 40


def test_the_pdf_is_a_book_not_a_notebook():
    pages = _pdf_pages()
    assert len(pages) <= MAX_PAGES, f"the PDF has {len(pages)} pages (at most {MAX_PAGES})"
    # A page whose only text is its number is blank too.
    blank = [i + 1 for i, text in enumerate(pages) if not re.sub(r"\d+", "", text).strip()]
    assert not blank, f"blank pages: {blank}"


def test_the_findings_come_first():
    """The first chapter after the contents states the findings: its table and figure."""
    pages = _pdf_pages()
    first = next(i for i, t in enumerate(pages) if _title(CHAPTERS[0]) in re.sub(r"\s+", " ", t)
                 and "Contents" not in t)
    assert first <= 3, f"the findings start on page {first + 1}"
    html = _page(CHAPTERS[0]).read_text(encoding="utf-8")
    assert 'id="tbl-headline"' in html and 'id="fig-predicted"' in html


BOOKKEEPING = [
    (re.compile(r"\b20\d{6}T\d{6}Z"), "a run id"),
    (re.compile(r"(?<![\w/#.-])[0-9a-f]{12,40}(?![\w/.-])"), "a commit or hash"),
    (re.compile(r"NOTES\.md"), "a pointer to the notes"),
    (re.compile(r"\b(target|goal)s?\b[^.]*\b(met|missed)\b", re.I), "a verdict on a target"),
]
APPENDICES = ("methods", "reproducibility", "data")


def test_no_bookkeeping_outside_the_appendices():
    for qmd in CHAPTERS:
        if qmd.stem in APPENDICES:
            continue
        html = _page(qmd).read_text(encoding="utf-8")
        text = re.sub(r"<[^>]+>", " ", html[html.find("<main") if "<main" in html else 0:])
        for pattern, what in BOOKKEEPING:
            hit = pattern.search(text)
            assert not hit, f"{_page(qmd).name}: {what}: {hit.group(0)!r}"


# File names, dates and code identifiers used as words (outside code): the appendices' business.
AS_WORDS = [
    (re.compile(r"[\w./-]+\.(?:py|csv|parquet|md|ya?ml|toml|json)\b"), "a file name"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}\b"), "a date"),
    # head_dim: the attention head's width, named as the attention APIs and the tables name it.
    (re.compile(r"\b(?!head_dim\b)[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b"), "a code identifier as a word"),
]


def _main_text(page: Path, drop_code: bool = True) -> str:
    html = page.read_text(encoding="utf-8")
    if "<main" in html:
        html = html[html.find("<main"):html.find("</main>")]
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    if drop_code:
        html = re.sub(r"<(code|pre)\b.*?</\1>", " ", html, flags=re.S)
    from html import unescape

    return unescape(re.sub(r"<[^>]+>", " ", html))


def test_chapters_free_of_file_names_dates_and_identifiers():
    """A chapter's text, captions and tables, as rendered: no file name, date or snake_case
    identifier outside code formatting (the reproducibility appendix has them)."""
    for qmd in CHAPTERS:
        if qmd.stem in APPENDICES:
            continue
        text = _main_text(_page(qmd))
        for pattern, what in AS_WORDS:
            hit = pattern.search(text)
            assert not hit, f"{_page(qmd).name}: {what}: {hit.group(0)!r}"


def test_every_table_numbered_and_captioned():
    """Every table of the HTML sits in a numbered, captioned Quarto table (label tbl-...)."""
    for page in _pages():
        html = page.read_text(encoding="utf-8")
        html = html[html.find("<main"):] if "<main" in html else html
        floats = re.findall(r'<div id="tbl-[^"]+"[^>]*>.*?</figure>', html, flags=re.S)
        inside = sum(f.count("<table") for f in floats)
        assert inside == html.count("<table"), \
            f"{page.name}: {html.count('<table') - inside} table(s) without a number and caption"
        for f in floats:
            assert "<figcaption" in f and re.search(r"Table&nbsp;[A-Z0-9]", f), \
                f"{page.name}: a table float without its numbered caption"
