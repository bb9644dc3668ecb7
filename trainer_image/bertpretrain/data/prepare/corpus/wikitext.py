"""Strip MediaWiki markup down to an article's running text (paragraphs of prose), with mwparserfromhell."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mwparserfromhell.nodes import Node, Wikilink

# Sections of lists, links and citations rather than prose.
_SKIPPED_SECTIONS = frozenset(
    {
        "references", "external links", "see also", "further reading", "notes", "bibliography",
        "sources", "citations", "footnotes", "notes and references", "references and notes",
        "works cited", "general references", "explanatory notes", "gallery",
    }
)  # fmt: skip
# Tags whose content is not running text: citations, tables, formulas, code, media.
_DROPPED_TAGS = frozenset(
    {
        "ref", "references", "table", "gallery", "math", "chem", "ce", "score", "timeline", "graph",
        "hiero", "imagemap", "inputbox", "categorytree", "templatedata", "templatestyles", "section",
        "syntaxhighlight", "source", "pre", "mapframe", "maplink", "indicator", "noinclude",
    }
)  # fmt: skip
_HIDDEN_LINK_NAMESPACES = frozenset({"file", "image", "media", "category"})
_LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(?:-[a-z]+)*")
_LIST_MARKUP = frozenset({"*", "#", ";", ":"})
_REFS_AND_COMMENTS = re.compile(
    r"<ref\b[^>]*?/>|<ref\b[^>]*>.*?</ref\s*>|<!--.*?-->", re.IGNORECASE | re.DOTALL
)
_BEHAVIOUR_SWITCH = re.compile(r"__[A-Z]+__")
# What removed templates leave behind: "(; born 1900)", "( )", "foos, )", "word ."
_EMPTY_BRACKETS = re.compile(r"\(\s*[,;:]?\s*\)")
_BRACKET_OPEN_PUNCTUATION = re.compile(r"\(\s*[,;:]\s*")
_BRACKET_CLOSE_PUNCTUATION = re.compile(r"\s*[,;:]\s*\)")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"[^\S\n]+([,.;:!?])")


def wikitext_to_prose(wikitext: str) -> str:
    """Running text of an article, paragraphs separated by blank lines.

    ``strip_code()`` alone keeps too much (file captions, categories, headings, citations and
    table cells), so a walk over mwparserfromhell's tree keeps only prose: text, the shown text of
    links, bold and italics and the contents of other inline tags, HTML entities. Dropped:
    templates (infoboxes, citations, navboxes), comments, ``<ref>``, tables, formulas, galleries,
    file/image/category links and interlanguage links, numbered links ``[http://...]``, list and
    indented lines, and
    whole sections that are lists of references or links ("See also", "References"...). Headings
    become paragraph breaks.
    """
    import mwparserfromhell

    # Citations and comments are often a third of an article's markup and never shown in its text;
    # removing them with a regular expression spares the parser that much work.
    wikitext = _REFS_AND_COMMENTS.sub("", wikitext)
    try:
        code = mwparserfromhell.parse(wikitext)
    except mwparserfromhell.parser.ParserError:
        # The parser's own consistency check; a page it cannot parse yields no sentences.
        return ""
    parts: list[str] = []
    _plain_text(code.nodes, parts)
    prose = _BEHAVIOUR_SWITCH.sub("", "".join(parts))
    prose = _EMPTY_BRACKETS.sub("", prose)
    prose = _BRACKET_OPEN_PUNCTUATION.sub("(", prose)
    prose = _BRACKET_CLOSE_PUNCTUATION.sub(")", prose)
    return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", prose)


def _plain_text(nodes: Iterable[Node], parts: list[str]) -> None:
    # Imported here, not at the top: only workers that meet wikitext need the parser.
    from mwparserfromhell.nodes import ExternalLink, Heading, HTMLEntity, Tag, Text, Wikilink

    skipped_section_level = 0  # while inside a skipped section: its heading's level
    skipping_line = False  # after a list or indentation marker, until the end of its line
    for node in nodes:
        if isinstance(node, Heading):
            if skipped_section_level and node.level > skipped_section_level:
                continue
            title = str(node.title.strip_code()).strip().lower()
            skipped_section_level = node.level if title in _SKIPPED_SECTIONS else 0
            skipping_line = False
            parts.append("\n\n")
        elif skipped_section_level:
            continue
        elif skipping_line:
            if isinstance(node, Text) and "\n" in node.value:
                parts.append(node.value[node.value.index("\n") :])
                skipping_line = False
        elif isinstance(node, Text):
            parts.append(node.value)
        elif isinstance(node, Wikilink):
            _link_text(node, parts)
        elif isinstance(node, Tag):
            if node.wiki_markup in _LIST_MARKUP:
                skipping_line = True
                continue
            tag = str(node.tag).strip().lower()
            if tag == "br":
                parts.append(" ")
            elif tag == "hr":
                parts.append("\n\n")
            elif tag not in _DROPPED_TAGS and node.contents is not None and not node.self_closing:
                _plain_text(node.contents.nodes, parts)
        elif isinstance(node, ExternalLink):
            # MediaWiki shows a bracketed link without a title as a number: "[1]".
            if not node.brackets:
                parts.append(str(node.url))
            elif node.title is not None:
                _plain_text(node.title.nodes, parts)
        elif isinstance(node, HTMLEntity):
            parts.append(node.normalize())
        # Templates, template arguments and comments are dropped.


def _link_text(link: Wikilink, parts: list[str]) -> None:
    title = str(link.title).strip()
    if title.startswith(":"):
        # [[:Category:Foo]] links to the category page instead of filing the article in it.
        title = title[1:]
    elif ":" in title:
        prefix = title.split(":", 1)[0].strip().lower()
        if prefix in _HIDDEN_LINK_NAMESPACES or (link.text is None and _LANGUAGE_CODE.fullmatch(prefix)):
            return
    if link.text is not None and str(link.text).strip():
        _plain_text(link.text.nodes, parts)
    else:
        parts.append(title)
