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


# Words that say nothing about what a question is about, per language (LANGUAGE_CODE's prefix):
# left out of a query so that "when", "my" and "can" neither rank a passage nor count towards how
# well it matched. PostgreSQL's configurations drop their own; SQLite's tokenizers have none.
STOP_WORDS = {
    "en": set("""a about above after again against all am an and any are as at be because been before being
        below between both but by can could did do does doing down during each few for from further get got had
        has have having he her here hers herself him himself his how i if in into is it its itself just me
        more most my myself no nor not now of off on once only or other our ours ourselves out over own same
        she should so some such than that the their theirs them themselves then there these they this those
        through to too under until up very was we were what when where which while who whom why will with
        would you your yours yourself yourselves anything something thing things any still want need please
        help hi hello tell know ok okay also much many
        s t d ll m re ve don doesn didn isn aren wasn weren won wouldn shouldn couldn haven hasn hadn""".split()),
    "es": set("""a al algo ante con contra cual cuando de del desde donde durante e el ella ellas ellos en
        entre era es esa ese eso esta este esto estoy fue ha hay la las le les lo los me mi mis muy ni no nos
        o os para pero por que qué quien se sea ser si sin sobre su sus también te tengo ti tu tus un una uno
        unos y ya yo cómo como puedo""".split()),
}


# Words and two-word phrases visitors use for what help pages say in other words, per language:
# each is searched for as itself or any of its alternatives. A site adds its own with the
# SEARCH_SYNONYMS setting.
SYNONYMS = {
    "en": {
        "send back": ["return"], "give back": ["return"], "bring back": ["return"], "take back": ["return"],
        "money back": ["refund"], "set up": ["setup", "start"], "stopped working": ["fault", "repair"],
        "get rid": ["delete", "close"], "sign in": ["log in", "login"], "log in": ["sign in", "login"],
        "wash": ["clean"], "dirty": ["clean"], "maintenance": ["care", "clean"], "maintain": ["care", "clean"],
        "broke": ["fault", "repair"], "broken": ["fault", "repair"], "fix": ["repair"], "faulty": ["fault", "repair"],
        "guarantee": ["warranty"], "guaranteed": ["warranty"], "warranty": ["guarantee"],
        "begin": ["start"], "unbox": ["start", "first"], "deliver": ["delivery", "shipping"],
        "delivery": ["shipping"], "shipping": ["delivery"], "package": ["parcel"], "parcel": ["package"],
        "receipt": ["invoice"], "voucher": ["gift card"], "promo": ["discount"], "coupon": ["discount"],
        "login": ["password", "sign in"], "bike": ["bicycle"], "profile": ["account"], "store": ["shop"],
        "phone": ["call"], "cancel": ["close"], "abroad": ["international"],
    },
}


def content_words(query, language_code):
    """``query_words(query)`` without the stop words of ``language_code``'s language; all of them
    when every word is one (a question of only common words still searches for something)."""
    words = query_words(query)
    stop = STOP_WORDS.get(_language(language_code), set())
    return [word for word in words if word not in stop] or words


def _language(language_code):
    return (language_code or "").lower().split("-")[0]


def query_terms(query, language_code, synonyms=None):
    """What to search for: ``[(word or phrase, *alternatives)]``, one tuple per thing the
    visitor asked about, in order. Two-word phrases of ``SYNONYMS`` (and of ``synonyms``, the
    site's own: ``{word or phrase: [alternatives]}``) are read first, then each content word."""
    known = {**SYNONYMS.get(_language(language_code), {}),
             **{str(key).lower(): [str(each).lower() for each in ([value] if isinstance(value, str) else value)]
                for key, value in (synonyms or {}).items()}}
    words = query_words(query)
    content = set(content_words(query, language_code))
    terms, skip = [], False
    for word, following in zip(words, words[1:] + [""]):
        if skip:
            skip = False
            continue
        pair = f"{word} {following}"
        if following and pair in known:
            terms.append((pair, *known[pair]))
            skip = True
        elif word in content:
            terms.append((word, *known.get(word, [])))
    return terms


def fts5_phrase(text):
    """``text`` as one FTS5 phrase (its words one after the other), so that no character a
    visitor types is ever FTS5 syntax (``"``, ``*``, ``NEAR``, ``:``, ``^``…)."""
    return '"' + text.replace('"', '""') + '"'


def fts5_query(terms):
    """An FTS5 MATCH expression for any of ``terms`` (words, or tuples of a word or phrase and
    its alternatives), OR-ed: the ranking (bm25) rewards passages holding more, and rarer, of
    them. "" for none."""
    return " OR ".join(fts5_phrase(each) for term in terms
                       for each in ((term,) if isinstance(term, str) else term))


def fts5_tokenizer(language_code):
    """The FTS5 tokenizer for a site in ``language_code``: Unicode words with diacritics removed,
    stemmed by FTS5's own Porter stemmer for English (the only stemmer FTS5 has)."""
    plain = "unicode61 remove_diacritics 2"
    return f"porter {plain}" if _language(language_code) == "en" else plain


# LANGUAGE_CODE prefix → PostgreSQL's text search configuration of that language.
PG_CONFIGS = {"da": "danish", "de": "german", "en": "english", "es": "spanish", "fi": "finnish", "fr": "french",
              "hu": "hungarian", "it": "italian", "nl": "dutch", "no": "norwegian", "nb": "norwegian",
              "pt": "portuguese", "ro": "romanian", "ru": "russian", "sv": "swedish", "tr": "turkish"}


def pg_config(language_code):
    """PostgreSQL's text search configuration for a site in ``language_code`` ("simple": none)."""
    return PG_CONFIGS.get(_language(language_code), "simple")


def excerpt(text, limit):
    """``text`` cut to ``limit`` characters on a space, with an ellipsis when cut."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", limit // 2, limit - 1)
    return text[:cut if cut > 0 else limit - 1].rstrip() + "…"
