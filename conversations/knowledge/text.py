"""Text for the site's knowledge, with nothing running: HTML reduced to text, bodies split into
passages, and a visitor's words made safe to hand to a full-text engine. Pure: no settings,
ORM or database."""

import re
from html.parser import HTMLParser

# Passages of about this many characters: long enough to hold an answer, short enough that a
# few of them fit in one tool result.
PASSAGE_CHARS = 1000
# Words of a query past this many are dropped: a pasted page must not become a huge query.
MAX_QUERY_WORDS = 32
MAX_WORD_CHARS = 64

_BLOCKS = {"p", "div", "br", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "table", "section",
           "article", "blockquote", "pre", "hr", "dd", "dt", "header", "footer"}
_HIDDEN = {"script", "style", "template", "head", "noscript"}


class _TextParser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.hidden = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in _HIDDEN:
            self.hidden += 1
        elif tag in _BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in _HIDDEN:
            self.hidden = max(0, self.hidden - 1)
        elif tag in _BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self.hidden:
            self.parts.append(data)


def html_to_text(markup):
    """The text of ``markup`` (an HTML fragment): tags dropped, scripts and styles with their
    content, entities decoded, block elements as paragraph breaks. Never rendered: the parser
    only reads."""
    parser = _TextParser()
    parser.feed(markup or "")
    parser.close()
    return normalize("".join(parser.parts))


def normalize(text):
    """``text`` with runs of spaces made one and at most one blank line between paragraphs."""
    lines = [" ".join(line.split()) for line in (text or "").replace("\r", "").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")


def split_passages(text, size=PASSAGE_CHARS):
    """``text`` cut into passages of at most about ``size`` characters, on paragraph boundaries
    where they fit, else on sentence ends, else on spaces, else hard (a body of any size is split,
    never refused). Returns a list of non-empty strings."""
    pieces = []  # (paragraph number, text): sentences of one paragraph are joined by a space
    for number, paragraph in enumerate(p.strip() for p in text.split("\n\n")):
        if not paragraph:
            continue
        if len(paragraph) <= size:
            pieces.append((number, paragraph))
            continue
        for sentence in _SENTENCE_END.split(paragraph):
            while len(sentence) > size:
                cut = sentence.rfind(" ", size // 2, size)
                cut = cut if cut > 0 else size
                pieces.append((number, sentence[:cut].strip()))
                sentence = sentence[cut:].strip()
            if sentence:
                pieces.append((number, sentence))
    passages, current, last = [], "", None
    for number, piece in pieces:
        joiner = " " if number == last else "\n\n"
        if current and len(current) + len(joiner) + len(piece) > size:
            passages.append(current)
            current = piece
        else:
            current = f"{current}{joiner}{piece}" if current else piece
        last = number
    if current:
        passages.append(current)
    return passages


_WORD = re.compile(r"\w+", re.UNICODE)


def query_words(query):
    """The words of a visitor's query (letters and digits of any alphabet), lower-cased, in order,
    each once: at most ``MAX_QUERY_WORDS`` of at most ``MAX_WORD_CHARS`` characters."""
    words = []
    for word in _WORD.findall((query or "").lower()):
        word = word[:MAX_WORD_CHARS]
        if word not in words:
            words.append(word)
        if len(words) == MAX_QUERY_WORDS:
            break
    return words


def fts5_query(query):
    """An FTS5 MATCH expression for ``query``: each word a quoted phrase token, joined by OR, so
    no character a visitor types is ever FTS5 syntax (``"``, ``*``, ``NEAR``, ``:``, ``^``…). The
    ranking (bm25) rewards passages holding more, and rarer, of the words. "" for no words."""
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in query_words(query))


# LANGUAGE_CODE prefix → PostgreSQL's text search configuration of that language.
PG_CONFIGS = {"da": "danish", "de": "german", "en": "english", "es": "spanish", "fi": "finnish", "fr": "french",
              "hu": "hungarian", "it": "italian", "nl": "dutch", "no": "norwegian", "nb": "norwegian",
              "pt": "portuguese", "ro": "romanian", "ru": "russian", "sv": "swedish", "tr": "turkish"}


def pg_config(language_code):
    """PostgreSQL's text search configuration for a site in ``language_code`` ("simple": none)."""
    return PG_CONFIGS.get((language_code or "").lower().split("-")[0], "simple")


def excerpt(text, limit):
    """``text`` cut to ``limit`` characters on a space, with an ellipsis when cut."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", limit // 2, limit - 1)
    return text[:cut if cut > 0 else limit - 1].rstrip() + "…"
