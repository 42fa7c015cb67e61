"""What a reader sees (bench.reading), on answers quoted from the recorded aim run
benchmarks/e2e-aim-holdout-epyc-avx2-qwen2.5-coder-1.5b-9084bce (router_holdout, the 1.5B)."""

from __future__ import annotations

import pytest

from sglang_specsot.bench.reading import (
    glued, list_items, one_item_lead_ins, read_answer, read_point, repeated_points, restates, split_title,
    visible_words, without_shared_opening,
)  # fmt: skip

Q15 = "How can you determine if a website is trustworthy before making a purchase?"
Q15_TITLES = ["Check the website's SSL certificate", "Look for reviews from other users",
              "Verify the website's reputation", "Check the website's terms of service",
              "Ensure the website is legitimate"]  # fmt: skip
Q15_SOT = """To determine if a website is trustworthy before making a purchase, you can follow these steps:

1. Check the website's SSL certificate. To determine if a website is trustworthy before making a purchase, it's crucial to check the website's SSL certificate.
2. Look for reviews from other users. To determine if a website is trustworthy before making a purchase, it's crucial to look for reviews from other users. These reviews can provide valuable insights into the website's credibility, quality, and overall experience.
3. Verify the website's reputation. Verifying the website's reputation is crucial before making a purchase. This involves checking the website's credibility and trustworthiness through various means. One effective way to do this is by looking for reviews from other users.
4. Check the website's terms of service. To ensure the website is legitimate, it's crucial to carefully read and understand the terms of service (TOS).
5. Ensure the website is legitimate. To ensure the website is legitimate, it's crucial to verify its legitimacy through several key steps. First, check the website's SSL certificate, which is a digital certificate that verifies the website's identity."""
Q0 = "What are the environmental consequences of fast fashion?"
Q6_POINT1 = """1. Prepare thoroughly. Preparing thoroughly for your first job involves several key steps to ensure a smooth and successful start. Here are some tips to help you prepare:
   - **Research the Company**: Before you start your job, thoroughly research the company.
2. Build a strong network. Building a strong network is crucial for any job application."""
Q16_POINT5 = """5. More cultural diversity in small towns often stems from a combination of factors, including:
   - Historical and geographical isolation: Small towns often have a longer history and are less influenced by urban trends and global culture."""
Q9_PLAIN = """Staying motivated while learning to code can be challenging, but there are several strategies you can use to keep yourself engaged and motivated. Here are some tips:

1. **Set Clear Goals**: Define what you want to achieve with your coding skills.

2. **Create a Routine**: Establish a regular schedule for coding practice.

3. **Join a Community**: Joining a coding community or online forum can provide support.

By implementing these strategies, you can stay motivated while learning to code and achieve your goals."""
Q9_SOT = """Staying motivated while learning to code can be challenging, but there are several strategies you can use to keep yourself engaged and motivated. Here are some tips:

1. Set achievable goals. Setting achievable goals is a crucial step in staying motivated while learning to code. It helps you focus on what you can accomplish in a short period and provides a sense of accomplishment when you reach them.
2. Join coding communities. Joining coding communities is a powerful way to stay motivated while learning to code."""


@pytest.mark.parametrize(
    ("point", "title", "question", "restating"),
    [  # q0 p2 and p5: the title continued into the question's own words
     ("2. Water pollution is a significant environmental consequence of fast fashion. Fast fashion often involves "
      "the production of large quantities of clothing in a short period, which can lead to overuse of water resources.",
      "Water pollution", Q0, True),
     ("5. Displacement of workers is a significant environmental consequence of fast fashion.", "Displacement of workers", Q0, True),
     # q9 p5 and q31 p2: the title again as a gerund
     ("5. Reward yourself for progress. Rewarding yourself for progress is a powerful motivator.",
      "Reward yourself for progress", "How can I stay motivated while learning to code?", True),
     ("2. Write clear, concise code. Writing clear, concise code is crucial for making your code easy to read, "
      "understand, and maintain.", "Write clear, concise code", "What are good habits for writing readable code?", True),
     # q15 p1: the question, then the title
     ("1. Check the website's SSL certificate. To determine if a website is trustworthy before making a purchase, "
      "it's crucial to check the website's SSL certificate.", Q15_TITLES[0], Q15, True),
     # q3 p1 and q20 p1: the body opens with content of its own
     ("1. Easy to learn. Python is known for its simplicity and ease of learning, making it an excellent choice for "
      "beginners and experienced programmers alike.", "Easy to learn", "What are the benefits of learning Python?", False),
     ("1. Learn about Japanese culture. Japanese culture is rich and diverse, with a strong emphasis on respect for "
      "tradition, harmony, and the natural world.", "Learn about Japanese culture",
      "What should first-time visitors to Japan know?", False)],
)  # fmt: skip
def test_a_point_that_opens_by_restating_its_title_or_the_question(point, title, question, restating):
    assert read_point(point, title, question).restates is restating


@pytest.mark.parametrize(
    ("point", "title", "is_glued"),
    [("5. Take breaks are crucial for maintaining productivity and preventing burnout.", "Take breaks", True),  # q6
     ("3. Prioritize needs is a crucial step in planning a budget for a wedding.", "Prioritize needs", True),  # q10
     ("3. Pack appropriately for the season in Japan is crucial for a smooth and enjoyable trip.",
      "Pack appropriately for the season", True),  # q20: "in Japan" between the title and its verb
     ("4. Be confident in yourself and your abilities. This means that you should have a clear understanding.",
      "Be confident", False),  # q6: continued, but grammatically
     ("2. Water pollution is a significant environmental consequence of fast fashion.", "Water pollution", False),  # a noun title
     ("1. Set a budget. To set a budget for a wedding, start by determining the total cost.", "Set a budget", False),
     ("2. Sleep is the body's time to repair itself.", "Sleep", False),  # one word: a noun, not an instruction
     ("2. **Sleep** is the body's time to repair itself.", "Sleep", False)],
)  # fmt: skip
def test_an_imperative_title_continued_as_a_subject_is_glued(point, title, is_glued):
    assert read_point(point, title, "").glued is is_glued
    body, alone = split_title(point, title)
    assert glued(body, title) is (is_glued and not alone)


def test_a_body_opening_on_a_verb_after_the_titles_colon_is_glued():
    # q101 of the held-out run at ca1bc42: the branch continued its title across the colon.
    point = "5. **Energy efficiency**: is the practice of using less energy to do the same job."
    assert read_point(point, "Energy efficiency", "").glued
    assert not read_point("5. **Energy efficiency**: Insulation is the cheapest saving.", "Energy efficiency", "").glued
    assert not read_point("5. **Energy efficiency**: Is it worth it? Yes.", "Energy efficiency", "").glued


def test_sentences_beyond_the_title_leave_the_title_out():
    one = read_point("4. Track spending. To track spending, it's crucial to maintain a detailed record of all expenses "
                     "incurred during the wedding.", "Track spending", "")  # fmt: skip
    assert one.sentences == 1
    assert read_point(Q9_SOT.split("\n\n")[1].split("\n")[0], "Set achievable goals", "").sentences == 2
    assert read_point("3. Comment your code.", "Comment your code", "").sentences == 0  # the bare title


def test_one_item_lead_ins_in_points_and_their_lists():
    assert one_item_lead_ins(Q6_POINT1) == 1  # q6: "Here are some tips to help you prepare:" then one tip
    assert one_item_lead_ins(Q16_POINT5) == 1  # q16: "including:" then one factor
    two = Q6_POINT1.replace("2. Build", "   - **Dress well**: Look the part.\n2. Build")
    assert one_item_lead_ins(two) == 0
    assert one_item_lead_ins(Q9_PLAIN) == 0  # the opening's lead-in has three points under it
    nested = "Tips:\n1. Rest:\n   - naps\n   - nights\n2. Eat"
    assert one_item_lead_ins(nested) == 0


def test_q15_repeats_two_of_its_points():
    bodies = [split_title(p, t)[0] for p, t in zip(Q15_SOT.split("\n")[2:], Q15_TITLES)]
    # Point 3 ends on "looking for reviews from other users" (point 2); point 5 on the SSL check (point 1).
    assert repeated_points(Q15_TITLES, bodies, Q15) == [(0, 4), (1, 2)]
    assert repeated_points(["Set a budget", "List all expenses"], ["Plan.", "Make a list of all expenses."], "") == []
    assert repeated_points(["Lower cost of living", "Lower living costs"], ["", ""], "") == [(0, 1)]  # near-same titles


def test_the_normal_answers_items_and_the_shared_opening():
    assert list_items(Q9_PLAIN) == 3 and list_items("- a\n- b\nText") == 2 and list_items("Prose only.") == 0
    sot_body, normal_body = without_shared_opening(Q9_SOT, Q9_PLAIN)
    assert sot_body.startswith("1. Set achievable goals") and normal_body.startswith("1. **Set Clear Goals**")
    assert without_shared_opening("Other opening.\n\n1. A", Q9_PLAIN) == ("Other opening.\n\n1. A", Q9_PLAIN)


def test_read_answer_on_q15():
    reading = read_answer(Q15_SOT, Q15_TITLES, Q9_PLAIN, Q15)
    assert len(reading.points) == 5 and reading.normal_items == 3
    assert [p.restates for p in reading.points] == [True, True, True, False, False]
    assert reading.repeated == ((0, 4), (1, 2)) and reading.one_item_lead_ins == 0
    assert reading.visible_words == visible_words(Q15_SOT) and 0 < reading.words_ratio


def test_visible_words_count_no_markdown():
    assert visible_words("1. **Set Clear Goals**: Define *what* you want.") == 7
    assert restates("", "Title words here", "") is False


def test_the_merge_joins_a_body_that_continues_its_title_and_the_reader_finds_it_whole():
    from sglang_specsot.sot.merge import merge_answer

    titles = ["Energy efficiency", "Take breaks"]
    answer = merge_answer(titles, {0: "is the practice of using less energy.", 1: "are crucial."})
    first, second = answer.text.splitlines()
    assert first == "1. **Energy efficiency** is the practice of using less energy."
    assert not read_point(first, titles[0], "").glued
    assert read_point(second, titles[1], "").glued  # an instruction continued as a subject stays glued
