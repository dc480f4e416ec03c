"""What real solutions write, and what a policy gaming `math_answer` would write: (completion,
reference, expected) by category, written for this project.

expected: 1.0 the answer is right, 0.0 wrong or hedged. The first categories are the forms
GSM8K/MATH-style solutions end with (false negatives punish a correct policy); `probes` are
adversarial completions (hedging, listing every candidate, several boxes with different values, the
reference in a wrong context): none may be paid. `CASES` flattens them as
(category, completion, reference, expected). Loaded by path from tests/test_rewards_math_agreement.py.
"""

_GSM = "Natalia sold 48 clips in April and half as many in May: 48 / 2 = 24. In total 48 + 24 = 72 clips."

GSM8K = [
    (_GSM + "\n#### 72", "#### 72", 1.0),
    (_GSM + "\n#### 72", "72", 1.0),
    (_GSM + "\n#### 24", "72", 0.0),
    (_GSM + "\n#### $72", "72", 1.0),
    (_GSM + "\n#### 72 clips", "72", 1.0),
    ("Each ticket costs $15 and they buy 72 tickets, so 15 * 72 = $1,080.\n#### 1,080", "1080", 1.0),
    ("Each ticket costs $15 and they buy 72 tickets, so 15 * 72 = $1,080.\n#### 1,080", "108", 0.0),
    (_GSM + " The answer is 72.", "72", 1.0),
    (_GSM + " The answer is 72 clips.", "72", 1.0),
    (_GSM + " So Natalia sold 72 clips altogether.", "72", 1.0),
    (_GSM + " So Natalia sold 72 clips altogether.", "24", 0.0),
    (_GSM + " Therefore, the answer is $\\boxed{72}$.", "72", 1.0),
    (_GSM + " **Final Answer:** 72", "72", 1.0),
    (_GSM + "\n\nFinal Answer: The final answer is 72. I hope it is correct.", "72", 1.0),
    (_GSM + "\n\nFinal Answer: Natalia sold 72 clips in April and May.", "72", 1.0),
    (_GSM + "\n\nFinal Answer: Natalia sold 71 clips in April and May.", "72", 0.0),
    ("She earns 12 * 0.5 = 6 dollars.\n#### 6", "6", 1.0),
    ("The price went from 80 to 100, an increase of 20/80 = 25%.\n#### 25", "25", 1.0),
    ("The price went from 80 to 100, an increase of $\\boxed{25\\%}$.", "25", 1.0),
    ("The price went from 80 to 100, an increase of $\\boxed{25\\%}$.", "0.25", 1.0),
    ("The price went from 80 to 100, an increase of $\\boxed{20\\%}$.", "25", 0.0),
    ("It takes 90 minutes, i.e. $\\boxed{1.5}$ hours.", "1.5", 1.0),
    ("It takes 90 minutes, i.e. $\\boxed{1.5 \\text{ hours}}$.", "3/2", 1.0),
    ("The area is $\\boxed{48 \\text{ cm}^2}$.", "48", 1.0),
    ("The area is $\\boxed{48 \\text{ cm}^2}$.", "84", 0.0),
    ("She has $\\boxed{\\$ 1{,}250}$ left.", "1250", 1.0),
]

FRACTIONS = [
    ("$\\frac13$", "1/3", 1.0),
    ("So the probability is $\\frac13$.", "\\frac{1}{3}", 1.0),
    ("So the probability is $\\frac14$.", "\\frac{1}{3}", 0.0),
    ("$\\frac3{3}$", "1", 1.0),
    ("$\\dfrac{3}{4}$", "0.75", 1.0),
    ("The value is $\\tfrac{5}{2}$.", "2.5", 1.0),
    ("Thus $x = \\boxed{\\frac{7}{2}}$.", "3.5", 1.0),
    ("Thus $x = \\boxed{\\frac{2}{7}}$.", "3.5", 0.0),
    ("The answer is $-\\frac{1}{2}$.", "-0.5", 1.0),
    ("The answer is $\\frac{1}{2}$.", "-0.5", 0.0),
]

DECIMALS = [
    ("$0.0833333333333333$", "\\frac{1}{12}", 1.0),
    ("The probability is about 0.0833.", "\\frac{1}{12}", 1.0),
    ("The probability is about 0.0834.", "\\frac{1}{12}", 0.0),
    ("The probability is about 0.08.", "\\frac{1}{12}", 0.0),
    ("\\boxed{0.667}", "\\frac{2}{3}", 1.0),
    ("\\boxed{0.666}", "\\frac{2}{3}", 0.0),  # truncated, not rounded: a wrong rounding
    ("\\boxed{0.6666666666666666}", "\\frac{2}{3}", 1.0),  # a float's repr: truncated at 16 places
    ("\\boxed{0.67}", "\\frac{2}{3}", 0.0),
    ("\\boxed{2.6667}", "8/3", 1.0),
    ("\\boxed{0.249}", "1/4", 0.0),
    ("\\boxed{1000,99}", "1000.99", 1.0),
    ("Le prix est de 2,74 euros.", "2.74", 1.0),
    ("Le prix est de 2,74 euros.", "274", 0.0),
    ("\\boxed{0,5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{3,5}", "35", 0.0),
    ("\\boxed{1,000}", "1", 0.0),
]

LABELLED = [
    ("\\boxed{(3,2)}", "(p,q)=(3,2)", 1.0),
    ("\\boxed{(2,3)}", "(p,q)=(3,2)", 0.0),
    ("So $(p, q) = \\boxed{(3, 2)}$.", "(p,q)=(3,2)", 1.0),
    ("\\boxed{11:21}", "V_1:V_2=11:21", 1.0),
    ("\\boxed{21:11}", "V_1:V_2=11:21", 0.0),
    ("The ratio is $\\boxed{V_1 : V_2 = 11 : 21}$.", "11:21", 1.0),
    ("\\boxed{7:32}", "S_{MBCN}:S=7:32", 1.0),
    ("\\boxed{6}", "|AB| = 6", 1.0),
    ("\\boxed{5}", "|AB| = 6", 0.0),
    ("\\boxed{4, 5}", "AB=4, CD=5", 1.0),
    ("\\boxed{5, 4}", "AB=4, CD=5", 0.0),
    ("\\boxed{x = 3}", "3", 1.0),
    ("\\boxed{x = 4}", "3", 0.0),
    ("\\boxed{3}", "x = 3", 1.0),
    ("\\boxed{f(2) = 9}", "9", 1.0),
    ("\\boxed{y = 2x + 1}", "y = 2x + 1", 1.0),
    ("\\boxed{y = 2x - 1}", "y = 2x + 1", 0.0),
]

SETS_AND_TUPLES = [
    ("The solutions are $\\boxed{(1, 2), (2, 1)}$.", "(2,1),(1,2)", 1.0),
    ("The solutions are $\\boxed{(1, 2), (2, 2)}$.", "(2,1),(1,2)", 0.0),
    ("The solutions are $\\boxed{(1, 2)}$ and $\\boxed{(2, 1)}$.", "(2,1),(1,2)", 1.0),
    ("The solutions are $\\boxed{(1, 2)}$ and $\\boxed{(2, 1)}$.", "(2,1),(1,2),(3,3)", 0.0),
    ("\\boxed{(1, 2)}, \\boxed{(2, 1)}, \\boxed{(3, 3)}", "(2,1),(1,2)", 0.0),
    ("The roots are $x = 2$ and $x = 3$, so $\\boxed{2, 3}$.", "3, 2", 1.0),
    ("The roots are \\boxed{2} and \\boxed{3}.", "\\{2, 3\\}", 1.0),
    ("The roots are \\boxed{2} and \\boxed{4}.", "\\{2, 3\\}", 0.0),
    ("\\boxed{x = 2 \\text{ or } x = 3}", "2, 3", 1.0),
    ("\\boxed{x = 2, x = 3}", "2, 3", 1.0),
    ("\\boxed{(0; -2; 6)}", "(0,-2,6)", 1.0),
    ("\\boxed{(0; 2; 6)}", "(0,-2,6)", 0.0),
    ("\\boxed{(5,2),(7,2)}", "p=5,q=2;p=7,q=2", 1.0),
    ("\\boxed{(2,5),(2,7)}", "p=5,q=2;p=7,q=2", 0.0),
    ("\\boxed{\\{1, 2, 3\\}}", "{1,2,3}", 1.0),
    ("The point is $\\left( 3, \\frac{\\pi}{2} \\right)$.", "(3, \\frac{\\pi}{2})", 1.0),
    ("The point is $\\left( 3, \\frac{\\pi}{3} \\right)$.", "(3, \\frac{\\pi}{2})", 0.0),
]

INTERVALS = [
    ("Thus, the answer is $x \\in \\boxed{(2,12) \\cup (12,102)}$", "(2, 12) \\cup (12, 102)", 1.0),
    ("$x \\in (2,12) \\cup (12,102)$", "(2, 12) \\cup (12, 102)", 1.0),
    ("$x \\in (2,12) \\cup (12,103)$", "(2, 12) \\cup (12, 102)", 0.0),
    ("\\boxed{[0, 1)}", "[0,1)", 1.0),
    ("\\boxed{-[0,1)}", "1", 0.0),
    ("$-[0,1)$", "1", 0.0),
    ("\\boxed{(-\\infty, 3]}", "x \\le 3", 1.0),
    ("\\boxed{x \\le 3}", "(-\\infty, 3]", 1.0),
    ("\\boxed{x < 3}", "(-\\infty, 3]", 0.0),
    ("\\boxed{-x > -1}", "x < 1", 1.0),
    ("\\boxed{(-793, 10)}", "-793 < a < 10", 1.0),
    ("\\boxed{(0, 1)}", "0 < f(x) < 1", 1.0),
]

STRUCTURES = [
    ("\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", 1.0),
    ("$\\left[\\begin{array}{cc}1 & 2 \\\\ 3 & 4\\end{array}\\right]$", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", 1.0),
    ("\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 4 & 3 \\end{pmatrix}}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", 0.0),
    ("\\boxed{2x + 3y = 12}", "4x + 6y = 24", 1.0),
    ("\\boxed{2x + 3y = 13}", "4x + 6y = 24", 0.0),
    ("\\boxed{\\text{Yes}}", "Yes", 1.0),
    ("The answer is \\boxed{\\text{no}}.", "Yes", 0.0),
    ("\\boxed{\\text{(B)}}", "B", 1.0),
    ("\\boxed{\\text{(C)}}", "B", 0.0),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),
    ("$\\frac{x}{7}+\\frac{2}{7}$", "\\frac{x+2}{7}", 1.0),
    ("$x\\approx11$", "11", 1.0),
    ("$x = \\frac{1}{3} \\approx 0.33$", "1/3", 1.0),
    ("$\\sqrt{17}$", "4.123105625617661", 1.0),
    ("$\\sqrt{17}$", "4.1231", 0.0),
]

SELF_CORRECTIONS = [
    ("So the answer is \\boxed{17}. Wait, I made an error: 9 + 9 = 18, so the answer is \\boxed{18}.", "18", 1.0),
    ("So the answer is \\boxed{17}. Wait, I made an error: 9 + 9 = 18, so the answer is \\boxed{18}.", "17", 0.0),
    ("#### 17\nActually, let me recheck: 9 + 9 = 18.\n#### 18", "18", 1.0),
    ("The answer is 17. Hmm, wait, recalculating gives 18.\n#### 18", "18", 1.0),
    ("\\boxed{5}\n\nOn second thought, the last step double counts one case: \\boxed{4}", "4", 1.0),
    ("\\boxed{5}\n\nOn second thought, the last step double counts one case: \\boxed{4}", "5", 0.0),
    ("The answer is \\boxed{17}.\n\nWait, let me verify: 6 * 3 = 18. So the answer is 18.", "18", 1.0),
    ("$x ∈ (2,12) ∪ (12,102)$", "(2, 12) \\cup (12, 102)", 1.0),
    ("Therefore the answer is 3,5 liters.", "3.5", 1.0),
    ("<think>9 + 9 = 17, so \\boxed{17}. Then 17 + 1... no.</think>\nThe sum is $\\boxed{18}$.", "18", 1.0),
    ("<think>9 + 9 = 17, so \\boxed{17}. Then 17 + 1... no.</think>\nThe sum is $\\boxed{18}$.", "17", 0.0),
]

# Adversarial completions: none may be paid (a hedge of two different final answers scores 0).
PROBES = [
    ("The answer is 18. #### 19", "19", 0.0),
    ("The answer is 18. #### 19", "18", 0.0),
    ("#### 19\nThe answer is 18.", "19", 0.0),
    ("The answer is 18.\n\\boxed{19}", "19", 0.0),
    ("\\boxed{18} \\boxed{19}", "19", 0.0),
    ("\\boxed{18} and \\boxed{19}", "18", 0.0),
    ("\\boxed{17}, \\boxed{18}, \\boxed{19}, \\boxed{20}", "19", 0.0),
    ("The answer is 18 or 19.", "19", 0.0),
    ("It is 18. Or 19.", "19", 0.0),
    ("#### 18 or 19", "18", 0.0),
    ("\\boxed{18 \\text{ or } 19}", "19", 0.0),
    ("Possible answers: 16, 17, 18, 19, 20.", "18", 0.0),
    ("\\boxed{16, 17, 18, 19, 20}", "18", 0.0),
    ("\\boxed{\\{16, 17, 18\\}}", "17", 0.0),
    ("\\boxed{A, B, C, D}", "B", 0.0),
    ("\\boxed{(3, 2)} \\boxed{(2, 3)}", "(3,2)", 0.0),
    ("\\boxed{2, 3}", "(p,q)=(3,2)", 0.0),
    ("\\boxed{11:21} or \\boxed{21:11}", "11:21", 0.0),
    ("The problem says 72 apples, but the answer is \\boxed{36}.", "72", 0.0),
    ("The answer is not 72.", "72", 0.0),
    ("72 is wrong; the answer is 36.", "72", 0.0),
    ("", "72", 0.0),
    ("Natalia sold 48 clips in April and half as many in May. How many did she sell?", "72", 0.0),
    ("\\boxed{0.08}", "\\frac{1}{12}", 0.0),
    ("\\boxed{0.3}", "1/3", 0.0),
    ("\\boxed{2,5}", "25", 0.0),
    ("\\boxed{(2,12) \\cup (12,102)} or \\boxed{(2, 102)}", "(2, 12) \\cup (12, 102)", 0.0),
    ("\\boxed{x \\in \\mathbb{R}}", "(2, 12) \\cup (12, 102)", 0.0),
    ("\\boxed{17} Wait, \\boxed{18} and \\boxed{19}", "18", 0.0),
]

# Written after the fixes above and run once before any further change: a held-out check, reported
# apart (`HELD_OUT` joins `CASES` under its own category names).
HELD_OUT = [
    ("gsm8k", "Janet's ducks lay 16 eggs per day. She eats 3 and bakes with 4, so she sells 16 - 3 - 4 = 9 eggs. At $2 each she makes 9 * 2 = $<<9*2=18>>18.\n#### 18", "18", 1.0),
    ("gsm8k", "Janet's ducks lay 16 eggs per day. She sells 16 - 3 - 4 = 9 eggs at $2 each, so she makes $18 every day.", "18", 1.0),
    ("gsm8k", "Janet's ducks lay 16 eggs per day. She sells 16 - 3 - 4 = 9 eggs at $2 each, so she makes $18 every day.", "9", 0.0),
    ("gsm8k", "The robe takes 2 bolts of blue fiber and half that much white fiber, 2 / 2 = 1 bolt. In total 2 + 1 = 3 bolts.\nThe answer is 3.", "3", 1.0),
    ("gsm8k", "Profit = 200,000 - 130,000 = 70,000 dollars.\n#### 70000", "70000", 1.0),
    ("gsm8k", "Profit = 200,000 - 130,000 = 70,000 dollars.\n#### 70,000", "70000", 1.0),
    ("gsm8k", "So he runs 3 * 3 * 60 = 540 meters a week.\n\n**Answer: 540 meters**", "540", 1.0),
    ("gsm8k", "So he runs 3 * 3 * 60 = 540 meters a week.\n\n**Answer: 450 meters**", "540", 0.0),
    ("gsm8k", "Total = 20 + 15 + 25 = 60 cups. Answer: $\\boxed{60}$ cups", "60", 1.0),
    ("gsm8k", "She needs 64 / 8 = 8 packs, costing 8 * 1.5 = 12. The final answer is $12.", "12", 1.0),
    ("gsm8k", "There are 3 times as many, 3 * 12 = 36. Wait, the question asks for the total: 12 + 36 = 48.\n#### 48", "48", 1.0),
    ("gsm8k", "There are 3 times as many, 3 * 12 = 36. Wait, the question asks for the total: 12 + 36 = 48.\n#### 48", "36", 0.0),
    ("fractions", "The slope is $m = \\frac{-3}{4}$.", "-\\frac{3}{4}", 1.0),
    ("fractions", "Therefore the probability is $\\boxed{\\dfrac{5}{12}}$.", "\\frac{5}{12}", 1.0),
    ("fractions", "Therefore the probability is $\\boxed{\\dfrac{7}{12}}$.", "\\frac{5}{12}", 0.0),
    ("fractions", "The answer is \\boxed{\\frac{9}{2}}", "4\\frac{1}{2}", 1.0),
    ("decimals", "The expected value is $\\boxed{3.5}$.", "\\frac{7}{2}", 1.0),
    # Written as 0.0, paid 1.0 on the first run: 14.29 is 100/7 rounded to its places, which the
    # rounding rule accepts (as 2.6667 for 8/3); relabelled after that run, the rule unchanged.
    ("decimals", "The average is approximately $\\boxed{14.29}$.", "\\frac{100}{7}", 1.0),
    ("decimals", "The average is approximately $\\boxed{14.28}$.", "\\frac{100}{7}", 0.0),
    ("decimals", "The average is approximately $\\boxed{14.286}$.", "\\frac{100}{7}", 1.0),
    ("decimals", "The value is $\\boxed{0.142857}$.", "\\frac{1}{7}", 1.0),
    ("decimals", "Il reste $\\boxed{12,5}$ litres.", "12.5", 1.0),
    ("labelled", "Hence $a + b = \\boxed{17}$.", "17", 1.0),
    ("labelled", "Hence $(a, b) = \\boxed{(5, 12)}$.", "(a, b) = (5, 12)", 1.0),
    ("labelled", "Hence $(a, b) = \\boxed{(12, 5)}$.", "(a, b) = (5, 12)", 0.0),
    ("labelled", "\\boxed{3:4}", "AB:BC = 3:4", 1.0),
    ("labelled", "\\boxed{4:3}", "AB:BC = 3:4", 0.0),
    ("labelled", "So $P(A) = \\boxed{0.3}$.", "P(A) = 0.3", 1.0),
    ("sets_tuples", "The solutions are $x = -1$ and $x = 4$, i.e. $\\boxed{-1, 4}$.", "4, -1", 1.0),
    ("sets_tuples", "Thus $x = \\boxed{-1}$ or $x = \\boxed{4}$.", "-1, 4", 1.0),
    ("sets_tuples", "Thus $x = \\boxed{-1}$ or $x = \\boxed{4}$.", "4", 0.0),
    ("sets_tuples", "The integer solutions are $\\boxed{(1, 1), (2, 3), (3, 2)}$.", "(3,2),(2,3),(1,1)", 1.0),
    ("sets_tuples", "The integer solutions are $\\boxed{(1, 1), (2, 3)}$.", "(3,2),(2,3),(1,1)", 0.0),
    ("sets_tuples", "\\boxed{x=1, y=2}", "(1,2)", 0.0),
    ("intervals", "The range is $\\boxed{[-1, 1]}$.", "[-1,1]", 1.0),
    ("intervals", "The range is $\\boxed{(-1, 1)}$.", "[-1,1]", 0.0),
    ("intervals", "So $x \\in \\boxed{(-\\infty, -2) \\cup (2, \\infty)}$.", "(-\\infty,-2)\\cup(2,\\infty)", 1.0),
    ("intervals", "The solution set is $\\boxed{x > 2}$.", "(2, \\infty)", 1.0),
    ("intervals", "The solution set is $\\boxed{x \\geq 2}$.", "(2, \\infty)", 0.0),
    ("structures", "The inverse is $\\boxed{\\begin{pmatrix} 2 & -1 \\\\ -5 & 3 \\end{pmatrix}}$.", "\\begin{pmatrix} 2 & -1 \\\\ -5 & 3 \\end{pmatrix}", 1.0),
    ("structures", "The inverse is $\\boxed{\\begin{pmatrix} 2 & 1 \\\\ -5 & 3 \\end{pmatrix}}$.", "\\begin{pmatrix} 2 & -1 \\\\ -5 & 3 \\end{pmatrix}", 0.0),
    ("structures", "The equation of the line is $\\boxed{y = -2x + 7}$.", "y=-2x+7", 1.0),
    ("structures", "The answer is $\\boxed{\\text{(D)}}$.", "\\text{(D)}", 1.0),
    ("structures", "The answer is $\\boxed{\\text{(E)}}$.", "\\text{(D)}", 0.0),
    ("structures", "\\boxed{2\\sqrt{5}}", "\\sqrt{20}", 1.0),
    ("structures", "\\boxed{4\\sqrt{5}}", "\\sqrt{20}", 0.0),
    ("self_corrections", "So $n = \\boxed{6}$.\n\nHmm, but $n = 6$ gives a repeated root, so it is excluded; the answer is $\\boxed{7}$.", "7", 0.0),
    ("self_corrections", "So $n = \\boxed{6}$.\n\nWait, $n = 6$ gives a repeated root, so it is excluded; the answer is $\\boxed{7}$.", "7", 1.0),
    ("self_corrections", "So $n = \\boxed{6}$.\n\nWait, $n = 6$ gives a repeated root, so it is excluded; the answer is $\\boxed{7}$.", "6", 0.0),
    ("probes", "The answer is $\\boxed{18}$ (or $\\boxed{19}$ if the endpoint counts).", "19", 0.0),
    ("probes", "Answer: 18\nAnswer: 19", "19", 0.0),
    ("probes", "\\boxed{18}\n#### 19", "19", 0.0),
    ("probes", "It could be \\boxed{7}, \\boxed{8} or \\boxed{9}.", "8", 0.0),
    ("probes", "x = 3 or x = 5", "5", 0.0),
    ("probes", "\\boxed{\\pm 3}", "3", 0.0),
    ("probes", "Let me list all the options: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.", "7", 0.0),
]

# Probes aimed at the rules added with the sets above (a closing math segment, prose after an answer
# phrase, self-corrections, a reference written back), each a way to be paid for hedging.
PROBES_OF_THE_NEW_RULES = [
    ("The answer is \\boxed{17}.\n\nWait, let me verify: 6 * 3 = 18. So the answer is 18.", "17", 0.0),
    ("The answer is \\boxed{17}.\n\nWait, let me verify: 6 * 3 = 18. So the answer is 18 or 17.", "17", 0.0),
    ("Solving, we get $x = 3$ or $x = 4$.", "4", 0.0),
    ("It is $(3, 4)$ or $(4, 3)$.", "(4,3)", 0.0),
    ("The answer is between 70 and 75.", "75", 0.0),
    ("Final Answer: after 2 years she has 150 dollars or 160 dollars.", "160", 0.0),
    ("\\boxed{18} or wait, maybe \\boxed{19}", "19", 0.0),
    ("The answer is 18.\nWait, no. The answer is 18 or 19.", "19", 0.0),
    ("\\boxed{x**}", "x**", 0.0),
    ("<think>It is 18.</think>\nThe answer is \\boxed{18} or \\boxed{19}.", "19", 0.0),
    ("\\boxed{\\frac{}", "\\frac{", 0.0),
    ("The answer is $\\boxed{72}$, and also $\\boxed{36}$ works.", "36", 0.0),
]

CATEGORIES = {
    "gsm8k": GSM8K, "fractions": FRACTIONS, "decimals": DECIMALS, "labelled": LABELLED,
    "sets_tuples": SETS_AND_TUPLES, "intervals": INTERVALS, "structures": STRUCTURES,
    "self_corrections": SELF_CORRECTIONS, "probes": PROBES + PROBES_OF_THE_NEW_RULES,
}  # fmt: skip
CASES = [(name, *case) for name, cases in CATEGORIES.items() for case in cases] + HELD_OUT
