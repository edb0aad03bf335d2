"""Ways a value the program holds could be shown or used as it was not in eager:

* printed text is shown after the graph, so a tensor printed and then changed in place would
  print its changed values: the in-place change is a graph break (``changed-after-print``),
  and the print comes first, as in eager;
* a for loop's items are listed when the loop starts, which would use up a one-shot iterator
  the program also holds (``it = iter(xs)``; ``for v in it: ... break``; ``next(it)``): a loop
  over such an iterator runs as Python (``held-iterator``);
* a list, set or dict the program made and holds twice at a break (two names, or a name and
  a bound method waiting on the stack) is made again as one object, not once per reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fxloom


def printed_by_both(fn, capsys, *args):
    expected = fn(*args)
    eager_text = capsys.readouterr().out
    compiled = fxloom.compile(fn)
    got = compiled(*args)
    assert capsys.readouterr().out == eager_text
    torch.testing.assert_close(got, expected)
    return compiled


def test_a_tensor_printed_then_changed_in_place_prints_its_value_before_the_change(capsys):
    def f(x):
        y = x * 2
        print(y)
        y.mul_(10)
        return y

    compiled = printed_by_both(f, capsys, torch.ones(2))
    assert "printed is changed in place" in compiled.explain().break_reasons[0].reason


def test_a_printed_tensor_changed_through_a_view_or_an_item_write_prints_as_in_eager(capsys):
    def through_a_view(x):
        y = x + 1
        print(y)
        y.view(-1).add_(5)
        return y

    def through_setitem(x):
        y = x + 1
        print(y)
        y[0] = 7.0
        return y

    def through_inplace_relu(x):
        y = x - 3
        print(y)
        return F.relu(y, inplace=True)

    for fn in (through_a_view, through_setitem, through_inplace_relu):
        printed_by_both(fn, capsys, torch.ones(2, 2))


def test_an_input_printed_then_changed_in_place_prints_as_in_eager(capsys):
    def f(x):
        print(x)
        x.add_(1)
        return x * 2

    expected_input = torch.ones(2)
    expected = f(expected_input)
    eager_text = capsys.readouterr().out
    compiled_input = torch.ones(2)
    got = fxloom.compile(f)(compiled_input)
    assert capsys.readouterr().out == eager_text
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(compiled_input, expected_input)


def test_changing_a_tensor_that_was_not_printed_stays_in_one_graph(capsys):
    def f(x):
        y = x * 2
        print(y)
        z = x + 1
        z.mul_(3)
        return y + z

    compiled = printed_by_both(f, capsys, torch.ones(2))
    assert compiled.explain().graph_count == 1


def test_a_loop_over_an_iterator_held_by_name_leaves_the_rest_for_next():
    def f(x, xs):
        it = iter(xs)
        for v in it:
            if v == 2:
                break
        return x + next(it, 100)

    compiled = fxloom.compile(f)
    for xs in ([1, 2, 3, 4], [1, 2, 5, 4], [1, 3]):
        torch.testing.assert_close(compiled(torch.ones(2), xs), f(torch.ones(2), xs))


def test_a_loop_over_a_generator_held_by_name_leaves_the_rest_for_next():
    def f(x, xs):
        def numbers():
            yield from xs

        it = numbers()
        for v in it:
            if v == 2:
                break
        return x + next(it, 100)

    compiled = fxloom.compile(f)
    for xs in ([1, 2, 3, 4], [2, 9]):
        torch.testing.assert_close(compiled(torch.ones(2), xs), f(torch.ones(2), xs))


def test_a_loop_over_an_enumerate_made_for_it_is_still_listed_into_one_graph():
    def f(x, weights):
        for index, weight in enumerate(weights):
            x = x * weight + index
        return x

    compiled = fxloom.compile(f)
    torch.testing.assert_close(compiled(torch.ones(2), [2, 3]), f(torch.ones(2), [2, 3]))
    assert compiled.explain().graph_count == 1


def test_a_container_held_twice_across_a_break_stays_one_object():
    def two_names(x):
        first = []
        second = first
        count = x.sum().item()  # a graph break: both names are handed on
        second.append(count)
        return x * len(first)

    def a_bound_method_on_the_stack(x):
        seen = set()
        seen.add(x.sum().item())  # the break comes while seen.add waits on the stack
        return x * len(seen)

    for fn in (two_names, a_bound_method_on_the_stack):
        compiled = fxloom.compile(fn)
        for x in (torch.ones(2), torch.ones(2) + 1):
            torch.testing.assert_close(compiled(x), fn(x))
