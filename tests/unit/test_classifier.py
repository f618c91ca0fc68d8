"""Task classifier: real-looking request shapes, malformed bodies, request signals, a floor."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.classify import scores
from bench.classify_data import DEFAULT_DATA, load_rows, to_items
from contracts.tasks import TASKS
from gateway.classify.classifier import TaskGuess, classify
from gateway.classify.text import read_request


def chat(*turns: str, system: str | None = None) -> dict[str, Any]:
    """A chat body: ``turns`` alternate user/assistant, starting and ending with the user."""
    messages = [{"role": "system", "content": system}] if system else []
    for i, turn in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": turn})
    return {"model": "m", "messages": messages}


PASSAGE = (
    "The Meridian Line railway opened in 1887 and connected the port of Halvik with the inland "
    "mining town of Corran. It was built by the Northern Rail Company under its chief engineer "
    "Edith Marsh, who later designed the Corran viaduct. Passenger services ended in 1962, "
    "although freight trains carried ore until 1979. Part of the route is now a cycle path. "
)
HANDBOOK = (
    "Section 4.2 Sick leave. Employees accrue one sick day per month of service, up to twelve "
    "days per calendar year. New hires receive three sick days on their start date. Unused "
    "days roll over to the next year up to a maximum of twenty. A doctor's note is required "
    "for absences longer than three consecutive working days. "
)

RAG = {
    "context in the system message": chat(
        "When did passenger services on the Meridian Line end?",
        system="Answer the user's question using only the reference material below. If the "
        "material does not contain the answer, say you don't know.\n\n" + PASSAGE * 5,
    ),
    "bare documents as the system message": chat(
        "Who designed the Corran viaduct?", system=(PASSAGE + "\n\n") * 6
    ),
    "xml documents": chat(
        "<documents>\n"
        + "".join(
            f'<document index="{i}">\n<source>history_{i}.txt</source>\n'
            f"<document_content>\n{PASSAGE}\n</document_content>\n</document>\n"
            for i in range(1, 4)
        )
        + "</documents>\n\nUsing the documents above, who built the Meridian Line?"
    ),
    "context tags": chat(
        f"<context>\n{PASSAGE * 3}\n</context>\n\nBased on the context, when did freight stop?"
    ),
    "markdown document blocks": chat(
        f"### Document 1\n{PASSAGE}\n\n### Document 2\n{HANDBOOK}\n\n### Document 3\n{PASSAGE}\n\n"
        "Answer the question from the documents and cite the document number.\n"
        "Question: How many sick days do new hires get?"
    ),
    "context in an earlier turn": chat(
        "Here is the leave section of our employee handbook:\n\n" + HANDBOOK * 5,
        "Thanks, I have read it. What would you like to know?",
        "How many sick days can roll over?",
    ),
    "langchain stuff prompt": chat(
        "Use the following pieces of context to answer the question at the end. If you don't "
        "know the answer, just say that you don't know, don't try to make up an answer.\n\n"
        f"{PASSAGE}\n\n{HANDBOOK}\n\n{PASSAGE}\n\nQuestion: Where did the railway start?\n"
        "Helpful Answer:"
    ),
    "numbered search results": chat(
        "Search results:\n"
        + "".join(f"[{i}] {PASSAGE}\n" for i in range(1, 5))
        + "\nWrite an answer to the query using the search results, citing them like [1].\n"
        "Query: what is the Meridian Line route used for today?"
    ),
    "chinese retrieval prompt": chat(
        "请根据以下资料回答问题。\n\n资料：\n"
        + "子午线铁路于1887年通车，连接哈尔维克港和内陆矿业小镇科兰。" * 12
        + "\n\n问题：这条铁路是哪一年通车的？"
    ),
}

CODE = {
    "function asked for in chat": chat(
        "write a python function that checks whether a string is a palindrome"
    ),
    "pasted code with a question": chat(
        "Why does this raise a KeyError when the config file is empty?\n\n```python\n"
        "def load(path):\n    with open(path) as f:\n        cfg = yaml.safe_load(f) or {}\n"
        "    return cfg['database']['url']\n```"
    ),
    "raw completion stub": {
        "model": "m",
        "prompt": 'def moving_average(xs: list[float], k: int) -> list[float]:\n    """Return the '
        "k-point moving averages of xs.\n    >>> moving_average([1, 2, 3, 4], 2)\n"
        '    [1.5, 2.5, 3.5]\n    """\n',
    },
    "unfenced javascript to fix": chat(
        "fix this, the button never updates:\n\nconst [count, setCount] = useState(0);\n"
        "function onClick() {\n  count++;\n  setCount(count);\n}\n"
        "return <button onClick={onClick}>{count}</button>;"
    ),
    "sql question": chat(
        "How do I get the second highest salary per department in PostgreSQL? I tried "
        "`SELECT department_id, MAX(salary) FROM employees GROUP BY department_id` but that "
        "only gives the highest."
    ),
    "traceback": chat(
        'Traceback (most recent call last):\n  File "app.py", line 12, in <module>\n'
        '    main()\n  File "app.py", line 8, in main\n    print(items[3])\n'
        "IndexError: list index out of range\n\nwhat am I doing wrong"
    ),
    "rust request": chat("Implement a thread-safe LRU cache in Rust with get and put."),
    "code review in a later turn": chat(
        "Can you review my Go handler?\n\nfunc handler(w http.ResponseWriter, r *http.Request) {\n"
        '\tid := r.URL.Query().Get("id")\n\trow := db.QueryRow("SELECT name FROM users WHERE id='
        '" + id)\n\tvar name string\n\trow.Scan(&name)\n\tfmt.Fprintf(w, name)\n}',
        "There are a few problems here, most importantly SQL injection ...",
        "How would you rewrite it with a prepared statement?",
    ),
}

CREATIVE = {
    "english poem": chat("Write a poem about the sea at dawn."),
    "screenplay scene": chat(
        "Write a short screenplay scene where two astronauts argue about who forgot the coffee."
    ),
    "vietnamese poem": chat("Hãy viết một bài thơ về mùa thu Hà Nội."),
    "chinese short story": chat("帮我写一个科幻短篇小说，主角是一名在火星上迷路的宇航员。"),
    "chinese poem": chat("写一首关于春天的诗"),
    "russian story": chat("Напиши рассказ о коте, который умел говорить."),
    "spanish tale": chat("Escribe un cuento corto sobre un dragón que tenía miedo al fuego."),
    "french poem": chat("Écris un poème sur la pluie à Paris."),
    "german story": chat("Schreibe eine Kurzgeschichte über einen Leuchtturmwärter."),
    "japanese haiku": chat("猫についての俳句を作ってください"),
    "portuguese lyrics": chat("Escreva uma letra de canção sobre saudade e o mar."),
    "korean poem": chat("바다에 관한 시를 써줘"),
    "roleplay": chat(
        "Let's role-play: you are a grumpy dragon guarding a bridge and I am a traveller. "
        "Stay in character."
    ),
}

CHAT = {
    "factual question": chat("What's the capital of Australia?"),
    "advice": chat("How can I get better at falling asleep earlier?"),
    "explanation behind a generic system prompt": chat(
        "Explain the difference between a virus and a bacterium.",
        system="You are a helpful assistant.",
    ),
    "follow-up after a long answer": chat(
        "What should I pack for a week of hiking in Iceland in June?",
        "Here is a packing list. " + "Bring layers, a waterproof shell and good boots. " * 60,
        "Do I really need gaiters?",
    ),
    "long persona prompt": chat(
        "What can you help me with?",
        system="You are Sunny, the friendly assistant of a garden centre. You always greet "
        "the customer warmly, you keep your answers short, you never discuss competitors and "
        "you suggest seasonal plants when you can. " * 6,
    ),
}


CLIMATE = (
    "Glaciers in the Alps lost about 10% of their remaining volume between 2022 and 2023, the "
    "largest two-year loss since measurements began. Scientists attribute the loss to low "
    "winter snowfall followed by record summer heat. Smaller glaciers below 3,000 metres are "
    "expected to disappear entirely by 2050 under current emission trends."
)
POLICY = (
    "Refunds are available within 30 days of purchase for unused items in their original "
    "packaging. Items bought on sale can be exchanged but not refunded. Refunds are issued to "
    "the original payment method within 5-7 business days after the return is received."
)
CHANGELOG = (
    "Release 3.0.0 removes support for Python 3.7 and adds the `timeout` argument to "
    "`Client.get()`. The deprecated `fetch_all()` helper is gone; use `iter_pages()` instead. "
)
RELEASE = (
    "Version 4.2 adds offline mode for the mobile app, so field teams can log inspections "
    "without a connection; entries sync when the device is back online. The release also "
    "drops support for Android 8 and fixes the crash on login reported by several users."
)


def xml_docs(*docs: tuple[str, str], indent: str = "", newline: str = "\n") -> str:
    """Anthropic-style document blocks."""
    return (
        f"<documents>{newline}"
        + "".join(
            f'{indent}<document index="{i}">{newline}{indent * 2}<source>{title}</source>'
            f"{newline}{indent * 2}<document_content>{newline}{text}{newline}"
            f"{indent * 2}</document_content>{newline}{indent}</document>{newline}"
            for i, (title, text) in enumerate(docs, 1)
        )
        + "</documents>"
    )


XML_RAG = {
    "anthropic blocks then a question": chat(
        xml_docs(("alps_glaciers_2023.pdf", CLIMATE * 2), ("policy.md", POLICY))
        + "\n\nHow much ice did Alpine glaciers lose in 2022-2023?"
    ),
    "indented blocks, instruction after": chat(
        xml_docs(("Return policy", POLICY * 2), ("FAQ", POLICY), indent="  ")
        + "\n\nAnswer the customer's question using only the documents. Quote the relevant "
        "part.\n\nCan I get my money back for something I bought on sale?"
    ),
    "one-line blocks in the system message": chat(
        "does the new version still work on android 8?",
        system="You are the support bot of FieldLog. Use these documents to answer:\n"
        + xml_docs(("release-notes-4.2", RELEASE), ("release-notes-4.1", RELEASE), newline=""),
    ),
    "question tag first": chat(
        "<question>Why are the Alpine glaciers shrinking so fast?</question>\n\n"
        + xml_docs(("news", CLIMATE), ("report summary", CLIMATE), ("blog", CLIMATE))
    ),
    "context and doc tags": chat(
        "<context>\n"
        + "".join(f'<doc id="{i}" title="Release notes">{RELEASE}</doc>\n' for i in range(3))
        + "</context>\n\nWhat does offline mode do?"
    ),
    "search results markup": chat(
        "<search_results>\n"
        + "".join(
            f"<result>\n<title>{t}</title>\n<url>https://example.org/{i}</url>\n"
            f"<content>{x}</content>\n</result>\n"
            for i, (t, x) in enumerate([("Glacier loss", CLIMATE), ("Refunds", POLICY)] * 2)
        )
        + "</search_results>\n\nUsing the search results, summarise what happened to the "
        "glaciers."
    ),
    "xml documents in an earlier turn": chat(
        "Please read these:\n" + xml_docs(("notes", RELEASE), ("policy", POLICY), indent="\t"),
        "I've read both documents.",
        "Which Android version is no longer supported?",
    ),
    "changelog with code spans in the documents": chat(
        xml_docs(("CHANGELOG.md", CHANGELOG * 3), ("migration.md", CHANGELOG * 2))
        + "\n\nWhich Python version is no longer supported in 3.0?"
    ),
    "system instruction, blocks in the user turn": chat(
        xml_docs(("hr-policy.pdf", HANDBOOK * 3)) + "\n\nHow many sick days do new hires get?",
        system="Answer only from the documents the user provides.",
    ),
}
PROGRAMMING_QUESTIONS = {
    "memory in python": chat(
        "How do you handle issues with memory in Python, i.e. preventing the app from using "
        "too much memory?"
    ),
    "spring security": chat(
        "help me with spring security. i want to use different filters for different referer "
        "header values. how do i do this?"
    ),
    "atomics in c++": chat(
        "Is there a way in C++ to atomically compare and exchange an atomic integer only if it "
        "is smaller than a bound?"
    ),
    "git history": chat("How do I undo my last commit in git but keep the changes?"),
    "kubernetes": chat(
        "What's the best way to roll out a config change to all pods in a Kubernetes "
        "deployment without downtime?"
    ),
    "async rust": chat("When should I use tokio::spawn versus just awaiting a future in Rust?"),
    "regex": chat("What regex matches a UK postcode?"),
    "pandas": chat("In pandas, how can I group by two columns and get the mean of a third?"),
    "django queries": chat(
        "How do I make my Django queries faster when a page lists thousands of rows?"
    ),
    "database choice": chat(
        "Should I use Postgres or MongoDB for an app with lots of relational data?"
    ),
    "docker image size": chat("Why is my Docker image 2 GB and how can I shrink it?"),
}
CHAT_NOT_CREATIVE = {
    "story-themed question": chat("Who wrote the story 'The Lottery' and what is it about?"),
    "summary of a novel": chat("Summarize the plot of Pride and Prejudice in a few sentences."),
    "edit grammar": chat(
        "Correct the grammar in this sentence: 'Me and him goes to the store yesterday.'"
    ),
    "poetry facts": chat("What is the difference between a sonnet and a villanelle?"),
    "song recommendation": chat("Recommend some songs for a road trip playlist."),
    "movie history": chat("Why was the movie Casablanca so successful when it came out?"),
    "email tips": chat("What are some tips for writing a professional email to a recruiter?"),
    "word meaning": chat("What does the word 'petrichor' mean?"),
    "recipe": chat("Give me a simple recipe for banana bread."),
    "rhymes": chat("What words rhyme with orange?"),
    "book recommendation": chat(
        "Can you recommend three fantasy novels similar to The Name of the Wind?"
    ),
}
CREATIVE_NOT_CHAT = {
    "script without a verb": chat(
        "A long script of two raccoons planning a heist on a campsite cooler, with lots of banter."
    ),
    "fantasy backstory": chat(
        "Write a dark, mysterious backstory for my tiefling warlock who made a pact with a "
        "forgotten sea god."
    ),
    "eulogy": chat(
        "write a eulogy for my grandfather, a fisherman who loved crossword puzzles and "
        "never missed a sunrise"
    ),
    "continue the story": chat(
        "Continue this story: The lighthouse keeper found the door open, though he had "
        "locked it himself the night before."
    ),
    "wedding toast": chat("Draft a funny wedding toast for my sister and her husband Tom."),
    "limerick with a system prompt": chat(
        "a limerick about a cat who hates mondays", system="You are a helpful assistant."
    ),
    "italian poem": chat("Scrivi una poesia sul mare d'inverno."),
    "bedtime story": chat("Compose a bedtime story about a sleepy owl for my four-year-old."),
    "pirate captain in character": chat(
        "Imagine you are a pirate captain and describe your ship to a new recruit, in character."
    ),
    "haiku without a verb": chat("Three haiku about a city waking up in winter, please."),
}


def grounded(instruction: str, question: str) -> dict[str, Any]:
    """A RAG request in another language: the grounding instruction and its context in the
    system message, the question from the user."""
    return {
        "messages": [
            {"role": "system", "content": instruction},
            {"role": "user", "content": question},
        ]
    }


# Grounding phrased in other Latin-script languages ("use only the following context"): the
# development RAG is English only, so these rest on the lexicon's grounding phrases.
NON_ENGLISH_RAG = {
    "spanish grounding": grounded(
        "Responde usando solo el siguiente contexto: El Parque Nacional Torres del Paine está "
        "en la Patagonia chilena. Fue creado en 1959 y tiene una superficie de 181.414 "
        "hectáreas. Cada año lo visitan más de 250.000 personas, sobre todo entre noviembre y "
        "marzo. Sus torres de granito alcanzan los 2.850 metros.",
        "¿Cuándo fue creado el parque?",
    ),
    "french grounding": grounded(
        "Réponds en utilisant uniquement le contexte suivant : Le Mont-Blanc culmine à 4 806 "
        "mètres. Il est situé entre la France et l'Italie. Son premier sommet fut atteint en "
        "1786 par Jacques Balmat et Michel Paccard. Le massif compte de nombreux glaciers, dont "
        "la Mer de Glace, le plus grand glacier de France.",
        "Quelle est l'altitude du Mont-Blanc ?",
    ),
    "german grounding": grounded(
        "Beantworte die Frage nur mit dem folgenden Kontext: Der Rhein ist 1.233 Kilometer "
        "lang und fließt durch sechs Länder. Er entspringt in den Schweizer Alpen und mündet in "
        "den Niederlanden in die Nordsee. Zu den wichtigsten Häfen gehört Duisburg, der größte "
        "Binnenhafen Europas.",
        "Wie lang ist der Rhein?",
    ),
    "portuguese grounding": grounded(
        "Responda apenas com base no seguinte contexto: O Cristo Redentor foi inaugurado em "
        "1931 no topo do morro do Corcovado, no Rio de Janeiro. A estátua mede 30 metros de "
        "altura, sem contar o pedestal de 8 metros. Em 2007 foi eleita uma das sete novas "
        "maravilhas do mundo.",
        "Quando o Cristo Redentor foi inaugurado?",
    ),
}

# Known misses of the shipped model, kept as strict xfails so that a fix shows: creative
# requests phrased as a transformation ("turn X into a sonnet") read as chat, as the
# development set labels its AlpacaEval items of that form; short programming questions whose
# only code cue is one tool name read as chat (the dev set labels many such items chat); RAG
# with a three-sentence context and a short question reads as chat.
KNOWN_MISSES = {
    "creative: sonnet from a list": chat(
        "Turn my grocery list into a dramatic Shakespearean sonnet: eggs, milk, stale bread, "
        "and far too much coffee."
    ),
    "code: typescript generics": chat(
        "Can you explain how conditional types work in TypeScript with a small example?"
    ),
    "code: reverse a list": chat("How do I reverse a list in Python?"),
    "code: react state": chat("When should I lift state up in React instead of using context?"),
    # a short context: English grounding over three sentences reads as chat too
    "rag: italian grounding": grounded(
        "Rispondi usando solo il seguente contesto: Il Colosseo fu inaugurato nell'anno 80 "
        "dopo Cristo sotto l'imperatore Tito. Poteva ospitare tra 50.000 e 80.000 spettatori. "
        "Era usato per combattimenti tra gladiatori e spettacoli pubblici.",
        "Quanti spettatori poteva ospitare il Colosseo?",
    ),
}


@pytest.mark.parametrize(
    ("task", "body"),
    [
        pytest.param(task, body, id=f"{task}: {name}")
        for task, table in (
            ("rag", RAG | XML_RAG | NON_ENGLISH_RAG),
            ("code", CODE | PROGRAMMING_QUESTIONS),
            ("creative", CREATIVE | CREATIVE_NOT_CHAT),
            ("chat", CHAT | CHAT_NOT_CREATIVE),
        )
        for name, body in table.items()
    ]
    + [
        pytest.param(name.split(":")[0], body, id=name, marks=pytest.mark.xfail(strict=True))
        for name, body in KNOWN_MISSES.items()
    ],
)
def test_real_request_shapes(task: str, body: dict[str, Any]) -> None:
    guess = classify(body)
    assert guess.task == task, guess.features
    assert 0.0 <= guess.confidence <= 1.0
    json.dumps(guess.features)  # serialisable for logs and /routes


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": None},
        {"messages": "hello"},
        {"messages": []},
        {"messages": [1, None, "x", []]},
        {"messages": [{"role": ["user"], "content": {"text": "hi"}}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"messages": [{"role": "user", "content": [None, 3, {"text": 5}]}]},
        {"messages": [{"role": "user"}], "tools": "nope", "response_format": ["json"]},
        {"prompt": None},
        {"prompt": 5},
        {"prompt": ""},
        {"prompt": [None]},
        {"prompt": {"text": "hi"}},
        {"prompt": b"bytes"},
    ],
)
def test_malformed_bodies_fall_back(body: dict[str, Any]) -> None:
    assert classify(body) == TaskGuess("chat", 0.25, {})
    assert classify(body, default_task="creative").task == "creative"


@pytest.mark.parametrize("body", [None, [], "text", 3])
def test_non_mapping_bodies_fall_back(body: Any) -> None:
    assert classify(body).task == "chat"


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[101, 2023], [101, 2003]], [[]]])
def test_token_id_prompts_use_the_default(prompt: list[Any]) -> None:
    assert classify({"prompt": prompt}).task == "chat"
    guess = classify({"prompt": prompt}, default_task="code")
    assert guess.task == "code"
    assert guess.confidence < 0.5


def test_completions_batch_uses_first_prompt() -> None:
    assert classify({"prompt": ["Write a limerick about a cat.", "def f(x):"]}).task == "creative"


def test_content_parts_are_read() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "text", "text": "Write a haiku about this photo."},
                ],
            }
        ]
    }
    assert classify(body).task == "creative"


def tool(name: str, description: str, **params: str) -> dict[str, Any]:
    """An OpenAI ``tools`` entry."""
    properties = {k: {"type": "string", "description": v} for k, v in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(params)},
        },
    }


WEATHER = tool("get_weather", "Current weather for a city", city="City name, e.g. Paris")
SEARCH = tool("web_search", "Search the web", query="What to search for")
CALENDAR = tool("create_event", "Add an event to the user's calendar", title="", start="ISO time")
CUSTOMERS = tool("find_customer", "Look up a customer in the CRM database", email="")
ORDERS = tool("sql_query", "Run a read-only SQL query on the orders database", query="SQL")
RUN_CODE = tool("run_python", "Execute Python code in a sandbox", code="Python source")


def with_tools(body: dict[str, Any], *tools: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**body, "tools": list(tools), **extra}


def tool_turns(ask: str, name: str, arguments: str, result: str, *rest: str) -> dict[str, Any]:
    """A conversation: the user asks, the assistant calls a tool, the tool answers, then the
    assistant and the user alternate with ``rest``."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": name, "arguments": arguments},
        }]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]  # fmt: skip
    for i, turn in enumerate(rest):
        messages.append({"role": "assistant" if i % 2 == 0 else "user", "content": turn})
    return {"model": "m", "messages": messages}


TOOL_CHAT = {
    "weather question with a weather tool": with_tools(
        chat("What's the weather like in Lisbon this afternoon?"), WEATHER
    ),
    "weather with tool_choice required": with_tools(
        chat("Do I need an umbrella in Manchester tomorrow?"), WEATHER, tool_choice="required"
    ),
    "forced function call": with_tools(
        chat("how cold is it in Montreal"),
        WEATHER,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ),
    "search tool offered": with_tools(
        chat(
            "Who won the women's singles at Wimbledon last year?",
            system="You are a helpful assistant. Use the tools when you need fresh information.",
        ),
        SEARCH,
        WEATHER,
    ),  # fmt: skip
    "calendar booking": with_tools(
        chat("Book a 30 minute call with Priya next Tuesday at 10am and call it 'Q3 review'."),
        CALENDAR,
    ),
    "customer database lookup": with_tools(
        chat("Can you pull up the account for m.okafor@example.org and tell me their plan?"),
        CUSTOMERS,
        ORDERS,
    ),  # fmt: skip
    "legacy functions field": {
        **chat("Remind me what meetings I have on Friday."),
        "functions": [{"name": "list_events", "parameters": {"type": "object"}}],
    },
    "after a weather tool result": with_tools(
        tool_turns(
            "Is it warm enough for the beach in Nice today?",
            "get_weather",
            '{"city": "Nice"}',
            '{"city": "Nice", "temp_c": 24, "conditions": "sunny", "wind_kph": 9}',
        ),
        WEATHER,
    ),  # fmt: skip
    "follow-up after a calendar result": with_tools(
        tool_turns(
            "What's on my calendar tomorrow?",
            "list_events",
            '{"date": "2024-05-14"}',
            '[{"title": "Standup", "start": "09:30"}, {"title": "Lunch with Sam", '
            '"start": "12:30"}, {"title": "1:1 with Dana", "start": "15:00"}]',
            "You have a standup at 9:30, lunch with Sam at 12:30 and a 1:1 with Dana at 3pm.",
            "Can you move the lunch to 1pm?",
        ),
        CALENDAR,
    ),
    "order lookup result": with_tools(
        tool_turns(
            "Where is my order 88123?",
            "sql_query",
            '{"query": "SELECT status, carrier FROM orders WHERE id = 88123"}',
            '{"rows": [{"status": "shipped", "carrier": "DHL", "eta": "2024-06-02"}]}',
        ),
        ORDERS,
    ),  # fmt: skip
    "json answer format": {
        **chat("List three facts about octopuses."),
        "response_format": {"type": "json_object"},
    },
}
TOOL_CODE = {
    "code request with a sandbox tool": with_tools(
        chat(
            "Write a Python function that parses ISO 8601 durations like PT1H30M into "
            "seconds, and test it."
        ),
        RUN_CODE,
    ),  # fmt: skip
    "sql to write, tools offered": with_tools(
        chat(
            "Write a SQL query that returns the ten customers with the highest total order "
            "value in 2023, joining the customers and orders tables."
        ),
        ORDERS,
    ),  # fmt: skip
    "fix a bug with tools offered": with_tools(
        chat(
            "My React component re-renders forever:\n\nuseEffect(() => {\n  setItems([...items,"
            " x]);\n}, [items]);\n\nHow do I fix it?"
        ),
        SEARCH,
    ),  # fmt: skip
}


@pytest.mark.parametrize(
    ("task", "body"),
    [pytest.param("chat", b, id=f"chat: {n}") for n, b in TOOL_CHAT.items()]
    + [pytest.param("code", b, id=f"code: {n}") for n, b in TOOL_CODE.items()],
)
def test_tools_do_not_decide_the_task(task: str, body: dict[str, Any]) -> None:
    """Tools, tool results and JSON output are no evidence of code: what is asked decides."""
    assert classify(body).task == task, classify(body).features


def test_unreadable_prompt_with_tools_uses_the_default() -> None:
    assert classify({"prompt": [1, 2, 3], "tools": [WEATHER]}) == TaskGuess("chat", 0.25, {})


def test_huge_bodies_return() -> None:
    big = ("All work and no play makes Jack a dull boy. " * 25_000)[:1_000_000]
    assert classify({"messages": [{"role": "user", "content": big}]}).task in TASKS
    assert classify({"prompt": big}).task in TASKS
    parts = [{"type": "text", "text": big}] * 1000
    assert classify({"messages": [{"role": "user", "content": parts}]}).task in TASKS
    many = [{"role": "user", "content": "hi"}] * 10_000 + [{"role": "user", "content": big}]
    assert classify({"messages": many}).task in TASKS


def test_reading_is_bounded() -> None:
    huge = "word " * 200_000  # 1 MB
    body = {
        "messages": [
            {"role": "system", "content": huge},
            *({"role": "user" if i % 2 else "assistant", "content": huge} for i in range(10_000)),
        ]
    }
    rt = read_request(body)
    assert rt is not None
    assert len(rt.text) <= 4_000
    assert len(rt.instr) <= 4_000
    assert rt.n_messages == 10_001
    assert rt.context_chars <= 10 * len(huge)  # only the examined messages are counted


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)
_keys = st.sampled_from(
    ["messages", "prompt", "tools", "tool_choice", "response_format", "functions", "role"]
)
_message = st.fixed_dictionaries(
    {}, optional={"role": _json | st.sampled_from(["user", "system", "tool"]), "content": _json}
)


@settings(max_examples=300, deadline=None)
@given(
    body=st.dictionaries(_keys, _json, max_size=5)
    | st.fixed_dictionaries({"messages": st.lists(_message | _json, max_size=5)})
)
def test_arbitrary_json_never_raises(body: dict[str, Any]) -> None:
    guess = classify(body)
    assert guess.task in TASKS
    assert 0.0 <= guess.confidence <= 1.0


@pytest.mark.skipif(
    not DEFAULT_DATA.is_dir(), reason=f"prompt dataset not present at {DEFAULT_DATA}"
)
def test_dataset_macro_f1_floor() -> None:
    items = to_items(load_rows(DEFAULT_DATA))
    truth = [task for _, task, _ in items]
    result = scores(truth, [classify(body).task for _, _, body in items])
    assert result["macro_f1"] >= 0.90, result["per"]


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "\ud800 hi"},
        {"messages": [{"role": "user", "content": "\udc00"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x\ud83d = 1"}]}]},
    ],
)
def test_lone_surrogates_from_json_escapes_never_raise(body: dict[str, Any]) -> None:
    assert classify(body).task in TASKS


@pytest.mark.parametrize(
    ("prompt", "text", "task"),
    [
        ("<|im_start|>user\nWhat's the tallest mountain in Africa?<|im_end|>\n<|im_start|>"
         "assistant\n", "What's the tallest mountain in Africa?", "chat"),
        ("Below is an instruction that describes a task. Write a response that appropriately "
         "completes the request.\n\n### Instruction:\nWhat causes the seasons?\n\n### Response:",
         "What causes the seasons?", "chat"),
        ("<s>[INST] Write a short poem about autumn leaves. [/INST]",
         "Write a short poem about autumn leaves.", "creative"),
        ("User: Write a Python function that reverses a linked list.\nAssistant:",
         "Write a Python function that reverses a linked list.", "code"),
    ],
)  # fmt: skip
def test_completion_prompts_lose_their_chat_template(prompt: str, text: str, task: str) -> None:
    """A completions prompt rendered with a chat template by hand is read without its roles
    and special tokens (``<|im_start|>`` is not code syntax, Alpaca's preamble not a writing
    request)."""
    rt = read_request({"model": "m", "prompt": prompt})
    assert rt is not None and rt.text == text
    assert classify({"model": "m", "prompt": prompt}).task == task
