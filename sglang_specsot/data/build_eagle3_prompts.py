"""Build eagle3_prompts.jsonl: the prompts whose answers, written by a target model, train an
EAGLE-3 draft head for it (`python -m sglang_specsot.models train-eagle3 TARGET`).

A deliberate grid, written for this project (same licence as the project): a list of topics
per kind and a few ask templates that fit that kind, plus hand-written one-off writing tasks
and short questions. Whole topics are held out: the 10th, 20th, ... topic of each kind (by
its position in the kind's list) goes to "heldout" with every prompt made from it.

    python sglang_specsot/data/build_eagle3_prompts.py

rewrites the file byte for byte. Plain Python, no third-party imports. Provenance and the
check against the project's benchmark question sets: data/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "eagle3_prompts.jsonl"
KINDS = ("code", "science", "skills", "compare", "writing", "short")
HELDOUT_EVERY = 10  # the topic at position 9, 19, 29, ... of each kind is held out

# ---- code -------------------------------------------------------------------------------------
# Topics a short Python example can show.
CODE_PYTHON_TEMPLATES = (
    "Explain {t} with a short example in Python.",
    "What are common mistakes people make with {t}?",
    "When should I use {t}, and when should I not?",
    "Write a Python function that shows {t} in use, with comments.",
)
CODE_PYTHON = (
    "binary search",
    "Python decorators",
    "list comprehensions",
    "generator functions",
    "context managers",
    "recursion",
    "memoization",
    "Python dictionaries",
    "Python sets",
    "dataclasses",
    "type hints",
    "exception handling",
    "f-strings",
    "asyncio",
    "threading",
    "the multiprocessing module",
    "default arguments",
    "lambda functions",
    "custom iterators",
    "sorting with a key function",
    "breadth-first search",
    "depth-first search",
    "Dijkstra's algorithm",
    "topological sorting",
    "hashing",
    "heaps and priority queues",
    "the two-pointer technique",
    "the sliding window technique",
    "binary search trees",
    "adjacency lists for graphs",
    "bit manipulation",
    "unit testing with pytest",
    "mocking in tests",
    "the logging module",
    "JSON serialization",
    "argparse",
    "pathlib",
    "NumPy broadcasting",
    "pandas groupby",
    "collections.Counter",
    "itertools",
    "class inheritance",
    "abstract base classes",
    "operator overloading",
)
# Tools and concepts that are not Python code.
CODE_GENERAL_TEMPLATES = (
    "Explain {t} with a short, concrete example.",
    "What are common mistakes people make with {t}?",
    "What problems can {t} help with, and what are the limits?",
    "How would you explain {t} to a new developer on the team?",
)
CODE_GENERAL = (
    "SQL joins",
    "database indexes",
    "database transactions",
    "database normalization",
    "git rebase",
    "git branching",
    "merge conflicts in git",
    "HTTP caching",
    "HTTP status codes",
    "cookies and sessions",
    "Docker containers",
    "continuous integration",
    "semantic versioning",
    "environment variables",
    "SSH keys",
    "cron jobs",
    "pipes in the Unix shell",
    "Unicode and text encodings",
    "floating-point arithmetic",
    "race conditions",
    "deadlocks",
    "rate limiting",
    "Big-O notation",
    "message queues",
    "load balancing",
    "DNS",
)

# ---- science ----------------------------------------------------------------------------------
SCIENCE_TEMPLATES = (
    "Explain how {t} works.",
    "What are the key facts everyone should know about {t}?",
    "Why does {t} matter in everyday life?",
)
SCIENCE = (
    "plate tectonics",
    "the carbon cycle",
    "the greenhouse effect",
    "nuclear fission",
    "nuclear fusion in the Sun",
    "radioactive decay",
    "electromagnetic induction",
    "the Doppler effect",
    "friction",
    "buoyancy",
    "DNA replication",
    "protein synthesis",
    "human digestion",
    "blood clotting",
    "blood sugar regulation",
    "antibiotic resistance",
    "the reflex arc",
    "REM sleep",
    "the placebo effect",
    "blood pressure",
    "inflation",
    "compound interest",
    "supply and demand",
    "opportunity cost",
    "comparative advantage",
    "central bank interest-rate policy",
    "the stock market",
    "insurance",
    "currency exchange",
    "gross domestic product",
    "the ozone layer",
    "a volcanic eruption",
    "the nitrogen cycle",
    "metabolism",
    "human vision",
    "muscle growth",
    "ocean acidification",
    "the Gulf Stream",
    "GPS positioning",
    "immune memory",
)

# ---- skills -----------------------------------------------------------------------------------
SKILLS_TEMPLATES = (
    "How can I get better at {t}?",
    "What are the first steps to start {t}?",
    "What mistakes do beginners make in {t}, and how can they avoid them?",
)
SKILLS = (
    "drawing portraits",
    "ice skating",
    "touch typing",
    "playing chess",
    "baking sourdough bread",
    "cooking simple weeknight meals",
    "taking photos with a phone",
    "swimming freestyle",
    "indoor rock climbing",
    "budgeting on a low income",
    "writing fiction",
    "knitting",
    "woodworking",
    "bird watching",
    "meditating",
    "training for a 5K",
    "strength training",
    "playing the piano",
    "taking notes in lectures",
    "doing mental arithmetic",
    "watercolour painting",
    "giving feedback at work",
    "commuting by bicycle",
    "video editing",
    "producing a podcast",
    "wild camping",
    "composting at home",
    "sewing",
    "calligraphy",
    "salsa dancing",
    "juggling",
    "stand-up comedy",
    "using spreadsheets",
    "learning sign language",
    "maintaining your own car",
    "doing basic plumbing repairs",
    "mentoring junior colleagues",
    "amateur astronomy",
    "growing herbs indoors",
    "beekeeping",
)

# ---- compare ----------------------------------------------------------------------------------
COMPARE_TEMPLATES = (
    "Compare {a} and {b}.",
    "What are the pros and cons of {a} versus {b}?",
)
COMPARE = (
    ("SQL databases", "document databases"),
    ("Rust", "Go"),
    ("REST", "GraphQL"),
    ("Vim", "Emacs"),
    ("Linux", "Windows"),
    ("leasing a car", "buying a car outright"),
    ("index funds", "individual stocks"),
    ("a gas stove", "an induction hob"),
    ("paper notebooks", "note-taking apps"),
    ("public schools", "homeschooling"),
    ("freelancing", "full-time employment"),
    ("high-speed rail", "short-haul flights"),
    ("coffee", "tea"),
    ("running", "cycling"),
    ("a Roth IRA", "a traditional IRA"),
    ("static typing", "dynamic typing"),
    ("unit tests", "integration tests"),
    ("SSDs", "hard disk drives"),
    ("cloud hosting", "running your own servers"),
    ("open-plan offices", "private offices"),
    ("a fixed-rate mortgage", "a variable-rate mortgage"),
    ("acrylic paint", "oil paint"),
    ("heat pumps", "gas boilers"),
    ("credit cards", "debit cards"),
    ("a gap year", "going straight to university"),
    ("team sports", "individual sports"),
    ("React", "Vue"),
    ("PostgreSQL", "MySQL"),
    ("object-oriented programming", "functional programming"),
    ("living alone", "living with flatmates"),
)

# ---- writing and short: one prompt a topic, written out in full -------------------------------
WRITING = (
    ("pull request review email", "Write a short, polite email asking a colleague to review my pull request."),
    ("water cycle summary", "Summarize the water cycle in one paragraph."),
    ("autumn rain haiku", "Write a haiku about autumn rain."),
    ("moving a client call", "Write a brief message to a client asking to move our Thursday call to Friday morning."),
    ("book club invitation", "Write an invitation to the first meeting of a neighbourhood book club."),
    ("lost cat poster", "Write the text for a poster about a lost grey cat named Pepper."),
    ("bug report", "Write a clear bug report for a login button that does nothing when tapped on a phone."),
    ("release notes", "Write release notes for version 2.1 of a to-do app that adds dark mode and fixes a sync bug."),
    ("README opening", "Write the opening section of a README for a command-line tool that converts Markdown to HTML."),
    ("commit message", "Write a git commit message for a change that fixes an off-by-one error in pagination."),
    ("flat listing", "Write a short, honest listing for a one-bedroom flat near a train station."),
    ("recipe introduction", "Write a short introduction for a family recipe for lentil soup."),
    ("sick day message", "Write a short message to my manager saying I am ill and will not be in today."),
    ("library poem", "Write a short free-verse poem about a quiet library."),
    ("beach clean-up recap", "Write a one-paragraph recap of a community beach clean-up for a local newsletter."),
    ("refund reply", "Write a friendly reply to a customer asking how to return an unopened item for a refund."),
    ("plain English rewrite",
     "Rewrite this in plain English: 'Pursuant to the aforementioned policy, remuneration shall be disbursed monthly.'"),
    ("meeting agenda", "Write an agenda for a 30-minute weekly team meeting."),
    ("elevator pitch", "Write a 30-second elevator pitch for an app that helps neighbours share garden tools."),
    ("shadow riddle", "Write a riddle whose answer is 'a shadow'."),
    ("farewell card", "Write a message for a farewell card for a coworker who is moving to another city."),
    ("Romeo and Juliet summary", "Write a two-sentence summary of the plot of Romeo and Juliet."),
    ("backup reminder post", "Write a short social media post reminding people to back up their phones."),
    ("barista dialogue", "Write a short dialogue between a barista and a customer who cannot decide what to order."),
    ("first-day checklist", "Write a checklist for a new employee's first day at an office."),
)
SHORT = (
    ("multiplication", "What is 24 times 36?"),
    ("entropy", "Define entropy in one sentence."),
    ("osmosis", "Define osmosis in one sentence."),
    ("algorithm", "What is an algorithm, in one sentence?"),
    ("irony", "What does the word 'irony' mean?"),
    ("binary", "What is 42 written in binary?"),
    ("greatest common divisor", "What is the greatest common divisor of 84 and 126?"),
    ("centimetres", "How many centimetres are in 3.5 metres?"),
    ("time zones", "Which country has the most time zones?"),
    ("absolute zero", "What is absolute zero in degrees Celsius?"),
    ("hexagon angles", "What is the sum of the interior angles of a hexagon?"),
    ("Moon landing", "In what year did humans first land on the Moon?"),
    ("Nineteen Eighty-Four", "Who wrote the novel 1984?"),
    ("hardest substance", "What is the hardest natural substance?"),
    ("dodecagon", "How many sides does a dodecagon have?"),
    ("Roman numerals", "What is 1994 in Roman numerals?"),
    ("plural of cactus", "What is the plural of 'cactus'?"),
    ("universal donor", "Which blood type is the universal donor?"),
    ("carbon-14", "What is the half-life of carbon-14?"),
    ("kilobyte", "How many bytes are in a kilobyte?"),
    ("remainder", "What is the remainder when 100 is divided by 7?"),
    ("general relativity", "Who proposed the theory of general relativity?"),
    ("metaphor", "Define a metaphor in one sentence."),
    ("power of two", "What is 2 to the power of 10?"),
    ("HTTP", "What does HTTP stand for?"),
)


def topics_by_kind() -> dict[str, list[tuple[str, list[str]]]]:
    """Each kind's topics in order, each with the prompts made from it."""
    code = [(t, [tpl.format(t=t) for tpl in CODE_PYTHON_TEMPLATES]) for t in CODE_PYTHON]
    code += [(t, [tpl.format(t=t) for tpl in CODE_GENERAL_TEMPLATES]) for t in CODE_GENERAL]
    return {
        "code": code,
        "science": [(t, [tpl.format(t=t) for tpl in SCIENCE_TEMPLATES]) for t in SCIENCE],
        "skills": [(t, [tpl.format(t=t) for tpl in SKILLS_TEMPLATES]) for t in SKILLS],
        "compare": [(f"{a} vs {b}", [tpl.format(a=a, b=b) for tpl in COMPARE_TEMPLATES]) for a, b in COMPARE],
        "writing": [(topic, [prompt]) for topic, prompt in WRITING],
        "short": [(topic, [prompt]) for topic, prompt in SHORT],
    }


def build_rows() -> list[dict]:
    """The rows of eagle3_prompts.jsonl, in file order."""
    rows: list[dict] = []
    for kind, topics in topics_by_kind().items():
        for position, (topic, prompts) in enumerate(topics):
            split = "heldout" if position % HELDOUT_EVERY == HELDOUT_EVERY - 1 else "train"
            for prompt in prompts:
                rows.append({"id": len(rows), "kind": kind, "topic": topic, "split": split, "prompt": prompt})
    return rows


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main() -> None:
    rows = build_rows()
    OUT.write_text(render(rows), encoding="utf-8")
    print(f"wrote {len(rows)} prompts to {OUT}")


if __name__ == "__main__":
    main()
