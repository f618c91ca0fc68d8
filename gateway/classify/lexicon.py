"""Word lists and patterns behind the task classifier's features.

General vocabulary of each task (programming terms, creative-writing genres in many languages,
retrieval phrasing), not strings taken from any evaluation set. All lower case. Everything is
immutable and compiled at import; nothing here is mutated.
"""

from __future__ import annotations

import re

# ASCII punctuation except "_" maps to a space (a bytes table: UTF-8 continuation bytes are
# >= 0x80, so translating the encoded text never splits a non-ASCII character).
_PUNCT = b"!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~"
_PUNCT_TABLE = bytes.maketrans(_PUNCT, b" " * len(_PUNCT))


def tokens(text: str) -> list[str]:
    """Whitespace/punctuation-separated tokens of ``text`` (already lower-cased)."""
    # surrogatepass: JSON may carry lone surrogates ("\ud800"); they stay opaque bytes here
    raw = text.encode("utf-8", "surrogatepass").translate(_PUNCT_TABLE)
    return raw.decode("utf-8", "surrogatepass").split()


PhraseGroups = tuple[tuple[str, tuple[str, ...]], ...]


def group_phrases(phrases: tuple[str, ...]) -> PhraseGroups:
    """Phrases keyed by their longest word, so a phrase is searched only when its key occurs."""
    groups: dict[str, list[str]] = {}
    for phrase in phrases:
        groups.setdefault(max(sorted(set(tokens(phrase))), key=len), []).append(phrase)
    return tuple((key, tuple(group)) for key, group in groups.items())


def count_phrases(text: str, tokens: frozenset[str], groups: PhraseGroups) -> int:
    """How many of the grouped phrases occur in ``text``, whose tokens are ``tokens``."""
    n = 0
    for key, group in groups:
        if key in tokens:
            for phrase in group:
                if phrase in text:
                    n += 1
    return n


# --- code -------------------------------------------------------------------------------------
# Tokens that are rare in prose but common in source text.
CODE_TOKENS = frozenset(
    """def elif lambda const var void struct impl fn println printf cout endl nullptr async
    await int bool str len foreach typeof undefined console namespace varchar sudo npm pip
    kubectl __init__ __name__ __main__ args kwargs argv malloc sizeof std vec usize mut import
    isinstance enumerate np pd plt df useeffect usestate jsx tsx stdout stderr stdin fmt func
    nil elseif endif endfunction dtype tensor config json boolean
    """.split()
)
# Names of languages, frameworks, tools and formats: near-certain evidence of a code task.
CODE_LANGS = frozenset(
    """python javascript typescript java kotlin swift rust golang ruby php perl scala haskell
    lua luau dart elixir clojure matlab julia cpp csharp fortran cobol verilog vhdl solidity
    sql mysql postgres postgresql sqlite mongodb redis nosql sqlalchemy regex regexp bash
    powershell zsh html css scss tailwind json yaml toml xml graphql websocket oauth jwt
    react vue angular svelte nextjs django flask fastapi laravel rails nodejs npm yarn pip
    conda docker dockerfile kubernetes k8s helm terraform ansible nginx git github gitlab
    linux ubuntu debian rhel centos wsl busybox systemd cron ssh unity godot roblox pygame
    flutter xcode swiftui tkinter pyqt electron vba numpy pandas matplotlib
    pytorch tensorflow keras sklearn opencv dataframe jupyter leetcode jquery unittest pytest
    jest junit selenium playwright puppeteer opengl cuda arduino esp32 ffmpeg curl grep awk
    latex gcc cmake makefile gradle maven py js ts ipynb yml exe dll apk
    """.split()
)
# Generic programming vocabulary, weaker evidence on its own.
CODE_TERMS = frozenset(
    """api apis sdk endpoint http https function functions method methods code coding codebase
    program programming bug bugs compile compiler compiling debug debugging exception
    traceback stacktrace segfault algorithm algorithms implement implementation refactor
    class classes array arrays integer integers string strings dict dictionary hashmap
    library libraries framework server servers localhost database query queries variable
    variables loop loops recursion recursive memoization runtime complexity syntax
    repository repo commit backend frontend webpage website component module modules package
    cli gui terminal shell parse parser parsing thread threads multithreading mutex atomic
    concurrency pointer pointers boolean shader firmware microcontroller embedded
    kernel driver filesystem excel formula macro spreadsheet binary file files input inputs
    output outputs element elements index tuple tuples returns test tests true false null
    android ios
    """.split()
)
# Requests to produce code: verb and object both in the instruction window.
CODE_VERBS = frozenset(
    "write create implement fix debug refactor optimize optimise generate build make convert "
    "complete rewrite port translate".split()
)
CODE_OBJECTS = frozenset(
    "function functions program programs code query regex snippet api component app "
    "application website webpage bot endpoint algorithm sql cli server script database "
    "extension plugin".split()
)
# SQL keywords, counted in upper case in the raw text when one of these tokens occurs.
SQL_KEYS = frozenset({"select", "insert", "join", "where"})
# Language names that punctuation splitting loses (searched only when "c" / "net" is a token).
LANG_PHRASE_GROUPS = (("c", ("c++", "c#")), ("net", (".net",)))

# --- retrieval-augmented generation ------------------------------------------------------------
# Words naming supplied material.
RAG_TERMS = frozenset(
    """context contexts passage passages document documents docs retrieved excerpt excerpts
    snippets sources citation citations cite article articles transcript knowledge
    contexto documento documentos contexte kontext dokument dokumente fragmento pasaje
    """.split()
)
# Phrases of grounded answering ("answer from the material above"), matched as substrings.
RAG_PHRASES = (
    "use the following", "using the following", "based on the", "based only on",
    "according to the", "answer the question", "answer the following question",
    "the context", "the passage", "the document", "the article", "the text above",
    "the above text", "the provided", "provided context", "retrieved", "search results",
    "don't know", "do not know", "not contain the answer", "make up an answer",
    "only the information", "using only", "from the context", "in the context",
    "cite ", "source:", "sources:",
    # the same grounding in other Latin-script languages (none occurs in the development set,
    # so the fit does not see them; the PRIOR weight on rag_phrases carries them)
    "siguiente contexto", "contexto proporcionado", "según el contexto", "siguientes documentos",
    "documentos proporcionados", "contexte suivant", "contexte fourni", "selon le contexte",
    "documents suivants", "folgenden kontext", "bereitgestellten kontext", "laut dem kontext",
    "folgenden dokumente", "seguinte contexto", "contexto fornecido", "de acordo com o contexto",
    "seguente contesto", "contesto fornito", "in base al contesto", "documenti forniti",
)  # fmt: skip
RAG_PHRASE_GROUPS = group_phrases(RAG_PHRASES)
# Passage structure at the start of a line: [1], Document 2:, <document>, ### Source, ...
DOC_MARKERS = re.compile(
    r"\n[ \t>*#-]*(?:"
    r"\[\d{1,3}\]"
    r"|\[?(?:doc|document|passage|source|chunk|excerpt|article|context|snippet|result)"
    r"[ _#-]*\d{1,3}\b"
    r"|</?(?:documents?|docs?|contexts?|sources?|passages?|chunks?|search_results?|excerpts?"
    r"|retrieved|article)\b"
    r"|(?:title|url|source|doc_id|document_id|page_content)\s*[:=]"
    r"|(?:documents?|context|sources?|passages?|references?)\s*:"
    r")",
    re.IGNORECASE,
)
# Markup that wraps supplied material (Anthropic-style <documents>, <context>, <search_results>,
# <source>/<document_content> fields, ...): counted as passage structure, then removed before the
# code features read the text, so that tags around prose never look like source code.
DOC_TAGS = re.compile(
    r"</?(?:documents?|document_content|docs?|contexts?|sources?|passages?|chunks?|snippets?"
    r"|search_results?|results?|excerpts?|articles?|retrieved\w*|references?|knowledge"
    r"|title|url|page_content|content|text|metadata|question|query|instructions?|answer"
    r"|user_query|information|background)\b[^<>\n]{0,80}>",
    re.IGNORECASE,
)
# Chat-template markup of a completions prompt rendered by hand (ChatML, Llama 2/3, Alpaca,
# "User: ... Assistant:"): the roles and special tokens of a conversation, not its text. Left
# in, ``<|im_start|>`` reads as code syntax and "Below is an instruction ... Write a response"
# as a writing request.
TEMPLATE_MARKUP = re.compile(
    r"<\|im_start\|>(?:system|user|assistant)?|<\|start_header_id\|>\w*<\|end_header_id\|>"
    r"|<\|(?:im_end|begin_of_text|eot_id|endoftext|end|user|assistant|system)\|>"
    r"|\[/?INST\]|<</?SYS>>|</?s>"
    r"|Below is an instruction that describes a task(?:, paired with an input that provides "
    r"further context)?\. Write a response that appropriately completes the request\."
    r"|^(?:### ?)?(?:Instruction|Response|Input|User|Assistant|Human|System)\s*:",
    re.MULTILINE,
)
QA_LABELS = (
    ("question", "question:"),
    ("answer", "answer:"),
    ("query", "query:"),
    ("q", "\nq:"),
    ("a", "\na:"),
)
# Cues in scripts without spaces between words, or with rich inflection (substring matches).
_QA_NON_LATIN = "问题：|答案：|質問：|回答：|вопрос:|ответ:"
_RAG_PHRASES_NON_LATIN = (
    "根据以下|根據以下|根据上述|根據上述|基于以下|基於以下|根据文章|根据资料|回答问题|回答問題"
    "|以下の文|に基づいて|を参考に|바탕으로|참고하여|на основе|используя|по тексту|согласно"
)
_RAG_TERMS_NON_LATIN = (
    "上下文|参考资料|参考文本|资料|資料|文档|文檔|材料|原文|文書|本文|문서|컨텍스트|контекст|документ"
    "|фрагмент|источник"
)

# --- creative writing --------------------------------------------------------------------------
CREATIVE_NOUNS = frozenset(
    """poem poems poetry poet story stories tale tales song songs lyrics haiku haikus sonnet
    limerick villanelle quatrain couplet lullaby anthem hymn script screenplay teleplay
    scene scenes novel novella chapter fanfic fanfiction fic rap ballad fable fables dialogue
    dialog dialogues monologue soliloquy verse verses narrative riddle riddles sketch skit
    sitcom comic comics cartoon episode prologue epilogue saga legend myth ode elegy
    fairytale fiction backstory plot slogan tagline jingle caption captions punchline
    punchlines joke jokes pun puns roast eulogy toast tribute vows speech letter diary blog
    advertisement ad ads commercial
    vignette parody satire rhyme rhymes stanza stanzas acrostic libretto storyboard
    poema poemas poesía poesia cuento cuentos historia relato novela guion guión canción
    cancion fábula leyenda escena personaje trama diálogo dialogo poème poeme poésie
    histoire conte récit recit chanson scénario personnage fable gedicht geschichte
    märchen erzählung kurzgeschichte lied liedtext drehbuch strophe racconto storia
    romanzo canzone favola fiaba sceneggiatura conto história canção roteiro personagem
    crônica diário thơ truyện chuyện kịch hát wiersz opowiadanie bajka piosenka
    scenariusz opowieść şiir hikaye hikâye öykü masal puisi cerita cerpen pantun dongeng
    sajak syair verhaal sprookje pesmu pjesmu pesma pjesma priču priča pricu prica stihova
    poezie poveste báseň povídka příběh pohádka scénář dikt digt berättelse sang thoại
    quảng publicitaria publicitario publicité werbung anuncio
    """.split()
)
CREATIVE_VERBS = frozenset(
    """write compose craft create generate tell draft continue imagine pen invent rewrite
    escribe escribir escríbeme redacta crea inventa compón écris ecris écrire rédige
    compose schreibe schreib verfasse dichte scrivi componi escreva escreve crie viết
    napisz ułóż yaz tulis buat buatkan karang schrijf napiši napisi sastavi scrie napiš
    skriv tạo
    """.split()
)
# Verbs that open a request to produce text (first words of the final user message).
WRITE_VERBS = frozenset(
    """write compose craft draft create generate imagine pretend invent pen describe
    escribe escríbeme redacta crea inventa compón imagina écris ecris rédige invente imagine
    schreibe schreib verfasse dichte stell scrivi componi immagina escreva escreve crie
    imagine viết tạo hãy napisz ułóż wyobraź yaz tulis buat buatkan karang schrijf napiši
    napisi sastavi scrie napiš použij skriv
    """.split()
)
WRITE_NON_LATIN = re.compile(
    "写|寫|書いて|書け|作って|作成|创作|創作|编|напиши|написать|придумай|придумать|сочини"
    "|представь|опиши|써|작성|만들어|اكتب|लिखो|लिखिए|เขียน|γράψε|כתוב"
)
# Fiction and verse vocabulary anywhere in the request.
FICTION_TERMS = frozenset(
    """character characters protagonist protagonists villain hero heroine plot fantasy magic
    magical dragon dragons kingdom wizard narrator pov rhyme rhyming stanza chorus verse
    roleplay chapter dialogue vivid imagery metaphor fictional tale quest adventure romance
    romantic comedy horror thriller mystery scifi anime manga fanfic episode sequel genre
    worldbuilding lore storyline readers reader tone dnd rpg campaign encounter tabletop
    personaje personnage figur personaggio персонаж
    """.split()
)
# Third-person singular pronouns: a request describing characters (narrative content).
NARRATIVE_PRONOUNS = frozenset(
    "he she him her his hers himself herself él ella elle er он она его её ее".split()
)
# A requested length: a number just before a unit word ("in 500 words", "8 lines", "1000字").
LENGTH_UNITS = frozenset(
    "word words palabras mots wörter parole palavras paragraph paragraphs stanza stanzas lines "
    "verses chapter chapters pages scene scenes sentences".split()
)
_NUMBER_BEFORE = re.compile(r"\d[\d,.]*\s*(?:-\s*\d[\d,.]*\s*)?$")
_UNITS_NON_LATIN = re.compile("字|単語|단어|слов|строк|từ")


def has_length_spec(text: str, tokens: frozenset[str]) -> bool:
    """True if ``text`` (whose tokens are ``tokens``) asks for a length in words, lines, ..."""
    for unit in tokens & LENGTH_UNITS:
        start = 0
        for _ in range(4):  # a few occurrences per unit word are enough
            i = text.find(unit, start)
            if i < 0:
                break
            if _NUMBER_BEFORE.search(text, max(i - 16, 0), i):
                return True
            start = i + 1
    if not text.isascii():
        for match in _UNITS_NON_LATIN.finditer(text):
            if text[max(match.start() - 2, 0) : match.start()].strip()[-1:].isdigit():
                return True
    return False


# Tone and style words of a writing request.
STYLE_WORDS = frozenset(
    """funny vivid emotional dark humorous humor humour creative engaging captivating poetic
    whimsical hilarious witty heartfelt dramatic epic touching suspenseful lyrical playful
    quirky eerie melancholic satirical sarcastic comedic imaginative evocative descriptive
    detailed verbose lengthy expressive
    divertido gracioso emotivo cómico drôle humoristique lustig witzig spannend divertente
    engraçado cômico hài
    """.split()
)
_CREATIVE_NON_LATIN = (
    "诗|詩|故事|小说|小說|剧本|劇本|续写|續寫|情节|情節|歌词|歌詞|散文|童话|童話|寓言|剧情|劇情"
    "|创作|創作|台词|对白|對白|主角|玄幻|武侠|科幻|仙侠|对联|押韵|绝句|律诗|物語|小説|俳句|短歌"
    "|川柳|ポエム|ストーリー|シナリオ|脚本|台本|台詞|セリフ|話を|시를|이야기|소설|동화|가사|대본|시나리오"
    "|줄거리|стих|поэм|рассказ|сказк|песн|сценари|роман|истори|сочини|сюжет|рифм|вірш"
    "|оповідан|казк|пісн|баллад|басн|новелл|тост|поздравлен|диалог|قصة|قصيدة|شعر|رواية|حكاية|أغنية|שיר|סיפור"
    "|कहानी|कविता|गीत|नाटक|शायरी|นิทาน|เรื่องสั้น|บทกวี|กลอน|นิยาย|ποίημα|ιστορία|παραμύθι"
    "|داستان|风格|風格|スタイル|스타일|幽默|搞笑|感人|смешн|юмор|стиле|стиль|реклам|广告|広告"
)
CREATIVE_SUBSTRINGS = (
    "once upon a time", "in the style of", "short story", "fan fiction", "conversation between",
    "dialogue between", "debate between", "back and forth", "write like",
)  # fmt: skip
CREATIVE_PHRASE_GROUPS = group_phrases(CREATIVE_SUBSTRINGS)

# Role-play and persona requests (creative, open-ended output).
ROLEPLAY_WORDS = frozenset("pretend roleplay embody persona impersonate simulate".split())
ROLEPLAY_PHRASES = (
    "role play", "role-play", "the role of", "play the part", "in character", "imagine yourself",
    "imagine you", "you will play", "speak like", "stay in character",
)  # fmt: skip
ROLEPLAY_PHRASE_GROUPS = group_phrases(ROLEPLAY_PHRASES)

# --- plain chat --------------------------------------------------------------------------------
QUESTION_STARTS = (
    "what", "how", "why", "who", "when", "where", "which", "can ", "could ", "is ", "are ",
    "do ", "does ", "should ", "would ", "explain", "tell me", "give me", "list ", "describe",
    "summarize", "summarise", "suggest", "i ", "i'm", "my ",
)  # fmt: skip
# Words of information-seeking requests, anywhere in the instruction window.
INFO_WORDS = frozenset(
    """information facts explain explanation examples example list tips steps ways recommend
    recommendations advice pros cons difference differences compare comparison
    """.split()
)
# Verbs of answering, explaining and transforming given text (instruction-following chat).
CHAT_VERBS = frozenset(
    """explain summarize summarise list compare calculate solve translate classify identify
    extract suggest recommend define analyze analyse evaluate correct paraphrase answer name
    rank rate rating estimate determine predict outline plan brainstorm proofread summary
    """.split()
)

# Every token any feature looks up: intersecting a request's tokens with this first leaves a
# handful of hits, so the per-feature intersections after it cost almost nothing.
VOCABULARY = frozenset().union(
    CODE_TOKENS, CODE_LANGS, CODE_TERMS, CODE_VERBS, CODE_OBJECTS, SQL_KEYS, RAG_TERMS,
    CREATIVE_NOUNS,
    CREATIVE_VERBS, WRITE_VERBS, FICTION_TERMS, NARRATIVE_PRONOUNS, LENGTH_UNITS, STYLE_WORDS,
    ROLEPLAY_WORDS, INFO_WORDS, CHAT_VERBS, (key for key, _ in QA_LABELS),
    *((key for key, _ in groups) for groups in (
        LANG_PHRASE_GROUPS, RAG_PHRASE_GROUPS, CREATIVE_PHRASE_GROUPS, ROLEPLAY_PHRASE_GROUPS
    )),
)  # fmt: skip

# One scan for all non-Latin cues: a plain alternation of literals (so the regex engine can
# skip ahead on their first characters), each literal mapped to the feature it counts for.
_NON_LATIN_KIND = {
    literal: kind
    for kind, literals in (
        ("creative_nouns", _CREATIVE_NON_LATIN),
        ("rag_terms", _RAG_TERMS_NON_LATIN),
        ("rag_phrases", _RAG_PHRASES_NON_LATIN),
        ("qa_labels", _QA_NON_LATIN),
    )
    for literal in literals.split("|")
}
NON_LATIN = re.compile("|".join(sorted(_NON_LATIN_KIND, key=len, reverse=True)))


def count_non_latin(text: str) -> dict[str, int]:
    """Matches of the non-Latin cues in ``text`` per feature name (ASCII text: all zero)."""
    counts = dict.fromkeys(("qa_labels", "rag_phrases", "rag_terms", "creative_nouns"), 0)
    if not text.isascii():
        for literal in NON_LATIN.findall(text):
            counts[_NON_LATIN_KIND[literal]] += 1
    return counts
