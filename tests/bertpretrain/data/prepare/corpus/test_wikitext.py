"""Wikipedia dumps (MediaWiki XML written by hand): which pages are read, and the markup stripped."""

from __future__ import annotations

import bz2
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

from tests.bertpretrain.data.prepare.corpus.reading import read, split

# --- Wikipedia ------------------------------------------------------------------------------------

ARTICLE = """{{Short description|Imaginary chemical element}}
{{Infobox element
| name = Foonium
| number = {{val|120}}
}}
'''Foonium''' (from [[Latin]] ''foonus'', {{lang-la|foonus}}) is a [[chemical element|metal]] with the \
symbol Fo.<ref name="a">{{cite web |title=Foo |url=http://example.com}}</ref> It was found in 1800.<ref \
name="a"/>
[[File:Foonium.jpg|thumb|A sample of [[foonium]].]]
<!-- a comment. -->

== History ==
Foonium was named by [[Humphry Davy]] &ndash; a chemist. See [http://example.com the site] or \
[http://example.org].
* A list item.
# A numbered item.
{| class="wikitable"
! Isotope !! Mass
|-
| Fo-1 || 1.0
|}
=== Uses ===
Foonium is used in <b>bold</b> things<br/>and more.
:An indented line.
<math>x^2</math>

== See also ==
* [[Barium]]
=== Nested ===
Nothing here is kept.

== References ==
{{reflist}}

== Later ==
Later text is kept.
__NOTOC__
[[Category:Chemical elements]]
[[de:Foonium]]
"""

FOONIUM_SENTENCES = [
    "Foonium (from Latin foonus) is a metal with the symbol Fo.",
    "It was found in 1800.",
    "Foonium was named by Humphry Davy – a chemist.",
    "See the site or.",
    "Foonium is used in bold things and more.",
    "Later text is kept.",
]


def page(title: str, text: str, ns: int = 0, redirect: str | None = None) -> str:
    redirect_tag = f'<redirect title="{escape(redirect)}" />' if redirect else ""
    return (
        f"<page><title>{escape(title)}</title><ns>{ns}</ns><id>{abs(hash(title)) % 1000}</id>{redirect_tag}"
        f"<revision><id>1</id><model>wikitext</model><format>text/x-wiki</format>"
        f'<text bytes="{len(text)}" xml:space="preserve">{escape(text)}</text></revision></page>\n'
    )


def mediawiki(*pages: str) -> bytes:
    return (
        '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11" xml:lang="en">\n'
        "<siteinfo><sitename>Wikipedia</sitename><dbname>enwiki</dbname><namespaces>"
        '<namespace key="0" case="first-letter" /><namespace key="1" case="first-letter">Talk</namespace>'
        "</namespaces></siteinfo>\n" + "".join(pages) + "</mediawiki>\n"
    ).encode()


WIKI_DUMP = mediawiki(
    page("Foonium", ARTICLE),
    page("Fooium", "#REDIRECT [[Foonium]]", redirect="Foonium"),
    page("Foonium metal", "#redirect [[Foonium]]"),
    page("Talk:Foonium", "Is this real? I think not.", ns=1),
    page("Foo", "'''Foo''' may be:\n* [[Foonium]]\n\n{{disambiguation}}"),
    page("Bar (disambiguation)", "'''Bar''' may be a [[pub]]."),
    page("Bar", "A '''bar''' serves drinks. [[:Category:Pubs|Pubs]] are bars."),
    page("Empty", " "),
)


@pytest.fixture()
def wiki_dump(tmp_path: Path) -> Path:
    file = tmp_path / "enwiki-pages-articles.xml.bz2"
    file.write_bytes(bz2.compress(WIKI_DUMP))
    return file


def test_wikipedia_articles_are_read_and_stripped(wiki_dump: Path) -> None:
    documents, skipped = read(wiki_dump)
    assert [(d.kind, d.origin) for d in documents] == [
        ("wikitext", f"{wiki_dump}: page 'Foonium'"),
        ("wikitext", f"{wiki_dump}: page 'Bar'"),
    ]
    assert documents[0].text == ARTICLE
    assert split(documents) == [FOONIUM_SENTENCES, ["A bar serves drinks.", "Pubs are bars."]]
    assert skipped == {"redirect": 2, "not main namespace": 1, "disambiguation page": 2, "empty document": 1}


def test_wikipedia_plain_xml_is_read(tmp_path: Path) -> None:
    file = tmp_path / "dump.xml"
    file.write_bytes(WIKI_DUMP)
    assert [d.origin for d in read(file)[0]] == [f"{file}: page 'Foonium'", f"{file}: page 'Bar'"]


def test_truncated_wikipedia_dump_is_an_error(tmp_path: Path) -> None:
    file = tmp_path / "dump.xml.bz2"
    file.write_bytes(bz2.compress(WIKI_DUMP)[:-40])
    with pytest.raises(ValueError, match=r"dump\.xml\.bz2 is truncated"):
        read(file)


@pytest.mark.parametrize(
    ("xml", "problem"),
    [
        (WIKI_DUMP.replace(b"</page>", b"</pag>", 1), "mismatched tag"),
        (WIKI_DUMP.replace(b"mediawiki", b"wiki"), "the root element is not <mediawiki>"),
        (b"<mediawiki><page><title>No site info</title></page></mediawiki>", "<siteinfo> tag not found"),
    ],
    ids=["mismatched", "root", "siteinfo"],
)
def test_malformed_wikipedia_dump_is_an_error(tmp_path: Path, xml: bytes, problem: str) -> None:
    file = tmp_path / "dump.xml"
    file.write_bytes(xml)
    with pytest.raises(ValueError, match=rf"dump\.xml is not a well-formed MediaWiki XML dump: .*{problem}"):
        read(file)
