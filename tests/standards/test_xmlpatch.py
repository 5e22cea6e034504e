"""The RFC 5261 patch engine, by behaviour: each operation, each error name, the feed example."""

from __future__ import annotations

import pickle

import pytest
from lxml import etree

from sis_platform.domain.fold import PatchCache, fold_master
from sis_platform.domain.items import split_message
from sis_platform.domain.limits import DEFAULT_LIMITS, Limits
from sis_platform.domain.messages import parse_message, parse_xml
from sis_platform.domain.pipeline import DeadLetter, LoggedMessage, classify_message
from sis_platform.domain.reasons import Outcome, Reason
from sis_platform.simulator.generator import INVALID_REASONS, generate_feed
from sis_platform.standards.xmlpatch import (
    ERROR_NAMES,
    Patch,
    PatchError,
    apply_patch,
    parse_patch,
)


def document(text: str) -> etree._ElementTree:
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
    return etree.fromstring(text.encode(), parser).getroottree()


def compile_patch(text: str) -> Patch:
    return Patch.from_element(parse_patch(text.encode()))


def patched(doc: str, patch: str) -> str:
    """The serialized result of applying `patch` (a <diff>) to `doc`."""
    return etree.tostring(compile_patch(patch).apply(document(doc)), encoding="unicode")


def failure(doc: str, patch: str) -> PatchError:
    """The PatchError raised by compiling or applying `patch` to `doc`."""
    with pytest.raises(PatchError) as raised:
        compile_patch(patch).apply(document(doc))
    return raised.value


# ---------------------------------------------------------------------------------------------
# Public interface


def test_patch_error_carries_rfc_error_name_and_detail() -> None:
    error = PatchError("unlocated-node", "operation 1 <remove sel='/a/b'>: sel matches no node")
    assert error.error == "unlocated-node"
    assert error.detail == "operation 1 <remove sel='/a/b'>: sel matches no node"
    assert str(error) == "unlocated-node: operation 1 <remove sel='/a/b'>: sel matches no node"


def test_patch_error_rejects_names_that_are_not_rfc_5261_errors() -> None:
    with pytest.raises(ValueError):
        PatchError("no-such-error", "detail")


def test_error_names_are_the_fourteen_rfc_5261_section_5_elements() -> None:
    assert ERROR_NAMES == {
        "invalid-attribute-value",
        "invalid-character-set",
        "invalid-diff-format",
        "invalid-entity-declaration",
        "invalid-namespace-prefix",
        "invalid-namespace-uri",
        "invalid-node-types",
        "invalid-patch-directive",
        "invalid-root-element-operation",
        "invalid-xml-prolog-operation",
        "invalid-whitespace-directive",
        "unlocated-node",
        "unsupported-id-function",
        "unsupported-xml-id",
    }


def test_patch_error_survives_pickling_with_error_and_detail() -> None:
    error = pickle.loads(pickle.dumps(PatchError("invalid-node-types", "why")))
    assert (error.error, error.detail) == ("invalid-node-types", "why")


def test_apply_returns_a_patched_copy_and_leaves_the_input_unchanged() -> None:
    original = document('<doc a="1"><b/></doc>')
    result = compile_patch('<diff><replace sel="doc/@a">2</replace></diff>').apply(original)
    assert result is not original
    assert etree.tostring(result) == b'<doc a="2"><b/></doc>'
    assert etree.tostring(original) == b'<doc a="1"><b/></doc>'


def test_failing_operation_raises_and_applies_nothing() -> None:
    original = document('<doc a="1"><b/></doc>')
    patch = compile_patch(
        '<diff><replace sel="doc/@a">2</replace><remove sel="doc/missing"/></diff>'
    )
    with pytest.raises(PatchError) as raised:
        patch.apply(original)
    assert raised.value.error == "unlocated-node"
    assert raised.value.detail.startswith("operation 2 <remove sel='doc/missing'>")
    assert etree.tostring(original) == b'<doc a="1"><b/></doc>'


def test_one_patch_applies_to_many_documents_independently() -> None:
    patch = compile_patch('<diff><add sel="doc" type="@seen">yes</add></diff>')
    first, second = document('<doc n="1"/>'), document('<doc n="2"/>')
    assert etree.tostring(patch.apply(first)) == b'<doc n="1" seen="yes"/>'
    assert etree.tostring(patch.apply(second)) == b'<doc n="2" seen="yes"/>'
    assert etree.tostring(patch.apply(first)) == b'<doc n="1" seen="yes"/>'


def test_apply_patch_compiles_and_applies_in_one_call() -> None:
    result = apply_patch(document("<doc/>"), parse_patch(b'<diff><add sel="doc"><a/></add></diff>'))
    assert etree.tostring(result) == b"<doc><a/></doc>"


@pytest.mark.parametrize(
    "parent",
    [
        "<diff>{}</diff>",
        '<sportsdata category="update" id="A B">{}</sportsdata>',
        '<p:patch xmlns:p="urn:ietf:rfc:7351">{}</p:patch>',
    ],
)
def test_operations_are_the_element_children_whatever_the_parent_is_called(parent: str) -> None:
    operations = '<replace sel="doc/@a">2</replace><!-- a comment --><?pi ignored?>'
    patch = Patch.from_element(parse_patch(parent.format(operations).encode()))
    assert len(patch) == 1
    assert etree.tostring(patch.apply(document('<doc a="1"/>'))) == b'<doc a="2"/>'


def test_empty_patch_returns_an_equal_copy() -> None:
    assert patched("<doc><a/>text</doc>", "<diff/>") == "<doc><a/>text</doc>"


# ---------------------------------------------------------------------------------------------
# docs/feed.md: updates to `event` masters

MASTER = """<event id="{id}" sport="horse-racing" country="GB" course="Ascot" name="{name}"
 start="2026-11-21T14:30:00Z" status="active" going="good">
  <market id="WIN" type="win" status="open">
    <selection id="3" number="3" name="Dancing Brave" status="runner">
      <price num="5" den="2"/>
    </selection>
    <selection id="7" number="7" name="Shergar" status="runner">
      <price num="11" den="1"/>
    </selection>
  </market>
</event>"""

UPDATE_BOTH_RACES = """<sportsdata category="update" id="ASC-20261121-1430 ASC-20261121-1500">
  <replace sel="/event/@going">soft</replace>
</sportsdata>"""

UPDATE_FIRST_RACE = """<sportsdata category="update" id="ASC-20261121-1430">
  <replace sel="/event/market[@id='WIN']/selection[@id='7']/price/@num">9</replace>
  <add sel="/event/market[@id='WIN']/selection[@id='3']" type="@status">non-runner</add>
</sportsdata>"""


def test_sportsdata_example_updates_apply_to_each_listed_master() -> None:
    masters = {
        "ASC-20261121-1430": document(MASTER.format(id="ASC-20261121-1430", name="Race 1")),
        "ASC-20261121-1500": document(MASTER.format(id="ASC-20261121-1500", name="Race 2")),
    }
    both = Patch.from_element(parse_patch(UPDATE_BOTH_RACES.encode()))
    first = Patch.from_element(parse_patch(UPDATE_FIRST_RACE.encode()))
    for master_id in ("ASC-20261121-1430", "ASC-20261121-1500"):
        masters[master_id] = both.apply(masters[master_id])
    masters["ASC-20261121-1430"] = first.apply(masters["ASC-20261121-1430"])

    race1 = masters["ASC-20261121-1430"].getroot()
    race2 = masters["ASC-20261121-1500"].getroot()
    assert race1.get("going") == race2.get("going") == "soft"
    assert race1.xpath("string(market[@id='WIN']/selection[@id='7']/price/@num)") == "9"
    assert race1.xpath("string(market[@id='WIN']/selection[@id='3']/@status)") == "non-runner"
    # The second race only got the first update.
    assert race2.xpath("string(market[@id='WIN']/selection[@id='7']/price/@num)") == "11"
    assert race2.xpath("string(market[@id='WIN']/selection[@id='3']/@status)") == "runner"


# ---------------------------------------------------------------------------------------------
# <add> (RFC 5261 section 4.3)


def test_add_appends_the_content_as_last_children_by_default() -> None:
    assert patched("<doc><a/>x</doc>", '<diff><add sel="doc"><b/></add></diff>') == (
        "<doc><a/>x<b/></doc>"
    )


def test_add_prepend_inserts_the_content_before_the_first_child() -> None:
    assert patched("<doc>x<a/></doc>", '<diff><add sel="doc" pos="prepend"><b/></add></diff>') == (
        "<doc><b/>x<a/></doc>"
    )


def test_add_before_and_after_insert_siblings_of_the_target() -> None:
    patch = (
        '<diff><add sel="doc/a" pos="before"><b/></add>'
        '<add sel="doc/a" pos="after"><c/></add></diff>'
    )
    assert patched("<doc>1<a/>2</doc>", patch) == "<doc>1<b/><a/><c/>2</doc>"


def test_add_copies_the_whitespace_text_nodes_of_its_content() -> None:
    # RFC 5261 A.5: the whitespace around the new element is added too.
    patch = '<diff><add sel="doc">\n  <foo/>\n</add></diff>'
    assert patched("<doc>\n  <a/>\n</doc>", patch) == "<doc>\n  <a/>\n\n  <foo/>\n</doc>"


def test_add_mixed_content_merges_text_with_the_neighbouring_text() -> None:
    patch = '<diff><add sel="doc/a" pos="after">one<b/>two</add></diff>'
    assert patched("<doc><a/>tail</doc>", patch) == "<doc><a/>one<b/>twotail</doc>"


def test_add_text_only_merges_into_the_existing_text_node() -> None:
    assert patched("<doc>abc</doc>", '<diff><add sel="doc">def</add></diff>') == (
        "<doc>abcdef</doc>"
    )


def test_add_before_a_text_node_puts_the_text_after_the_new_nodes() -> None:
    patch = '<diff><add sel="doc/b/text()" pos="before"><c>1</c></add></diff>'
    assert patched("<doc><b>3</b></doc>", patch) == "<doc><b><c>1</c>3</b></doc>"


def test_add_after_a_tail_text_node_inserts_after_that_text() -> None:
    patch = '<diff><add sel="doc/text()[1]" pos="after"><c/></add></diff>'
    assert patched("<doc><a/>x<b/></doc>", patch) == "<doc><a/>x<c/><b/></doc>"


def test_add_comments_and_processing_instructions() -> None:
    patch = '<diff><add sel="doc"><!-- note --><?render fast?></add></diff>'
    assert patched("<doc/>", patch) == "<doc><!-- note --><?render fast?></doc>"


def test_add_comments_and_processing_instructions_around_the_root_element() -> None:
    patch = (
        '<diff><add sel="doc" pos="before"><!-- head -->\n<?pi one?></add>'
        '<add sel="doc" pos="after"><!-- tail --></add></diff>'
    )
    assert patched("<doc/>", patch) == "<!-- head --><?pi one?><doc/><!-- tail -->"


def test_add_after_a_prolog_comment_inserts_at_document_level() -> None:
    patch = '<diff><add sel="comment()[1]" pos="after"><?pi two?></add></diff>'
    assert patched("<!--c--><doc/>", patch) == "<!--c--><?pi two?><doc/>"


def test_add_attribute_with_type_at_name() -> None:
    assert patched("<doc><a/></doc>", '<diff><add sel="doc/a" type="@n">v</add></diff>') == (
        '<doc><a n="v"/></doc>'
    )


def test_add_attribute_with_empty_content_adds_an_empty_value() -> None:
    assert patched("<doc/>", '<diff><add sel="doc" type="@n"/></diff>') == '<doc n=""/>'


def test_add_attribute_that_exists_sets_its_value() -> None:
    assert patched('<doc n="1"/>', '<diff><add sel="doc" type="@n">2</add></diff>') == (
        '<doc n="2"/>'
    )


def test_add_prefixed_attribute_uses_the_targets_prefix_for_the_namespace() -> None:
    patch = '<diff xmlns:y="urn:x"><add sel="doc/a" type="@y:n">v</add></diff>'
    assert patched('<doc xmlns:x="urn:x"><a/></doc>', patch) == (
        '<doc xmlns:x="urn:x"><a x:n="v"/></doc>'
    )


def test_add_prefixed_attribute_declares_the_patch_prefix_when_the_target_has_none() -> None:
    patch = '<diff xmlns:y="urn:y"><add sel="doc/a" type="@y:n">v</add></diff>'
    assert patched("<doc><a><b/></a></doc>", patch) == (
        '<doc><a xmlns:y="urn:y" y:n="v"><b/></a></doc>'
    )


def test_add_xml_lang_attribute() -> None:
    assert patched("<doc/>", '<diff><add sel="doc" type="@xml:lang">en</add></diff>') == (
        '<doc xml:lang="en"/>'
    )


def test_add_namespace_declaration_with_type_namespace() -> None:
    patch = '<diff><add sel="doc/a" type="namespace::p">urn:p</add></diff>'
    assert patched("<doc><a>x<b/></a></doc>", patch) == ('<doc><a xmlns:p="urn:p">x<b/></a></doc>')


def test_add_namespace_declaration_on_the_root_keeps_the_prolog() -> None:
    patch = '<diff><add sel="doc" type="namespace::p">urn:p</add></diff>'
    assert patched("<!--c--><doc><a/></doc><!--d-->", patch) == (
        '<!--c--><doc xmlns:p="urn:p"><a/></doc><!--d-->'
    )


def test_add_namespace_declaration_for_a_uri_an_ancestor_binds_to_another_prefix() -> None:
    patch = '<diff><add sel="doc/a" type="namespace::p">urn:x</add></diff>'
    assert patched('<doc xmlns:x="urn:x"><a/></doc>', patch) == (
        '<doc xmlns:x="urn:x"><a xmlns:p="urn:x"/></doc>'
    )


def test_namespace_operations_keep_the_prefixes_of_other_names() -> None:
    patch = '<diff><add sel="doc" type="namespace::z">urn:z</add></diff>'
    assert patched('<doc xmlns:x="urn:x" xmlns:y="urn:x"><y:a/><x:b/></doc>', patch) == (
        '<doc xmlns:x="urn:x" xmlns:y="urn:x" xmlns:z="urn:z"><y:a/><x:b/></doc>'
    )


def test_added_content_keeps_its_namespace_under_the_targets_prefix() -> None:
    # RFC 5261 section 4.2.3: namespace mangling.
    patch = '<diff xmlns:y="urn:x"><add sel="doc"><y:a y:n="1"><y:b/></y:a></add></diff>'
    assert patched('<doc xmlns:x="urn:x"/>', patch) == (
        '<doc xmlns:x="urn:x"><x:a x:n="1"><x:b/></x:a></doc>'
    )


def test_added_content_declares_namespaces_the_target_lacks() -> None:
    patch = '<diff xmlns:y="urn:y"><add sel="doc"><y:a/></add></diff>'
    assert patched("<doc/>", patch) == '<doc><y:a xmlns:y="urn:y"/></doc>'


def test_added_unqualified_element_under_a_default_namespace_stays_unqualified() -> None:
    result = patched(
        '<doc xmlns="urn:d"/>', '<diff xmlns:d="urn:d"><add sel="d:doc"><a><b/></a></add></diff>'
    )
    assert result == '<doc xmlns="urn:d"><a xmlns=""><b/></a></doc>'
    assert etree.fromstring(result)[0].tag == "a"


# ---------------------------------------------------------------------------------------------
# <replace> (RFC 5261 section 4.4)


def test_replace_element_keeps_the_text_after_it() -> None:
    assert patched("<doc>x<a/>y</doc>", '<diff><replace sel="doc/a"><b>1</b></replace></diff>') == (
        "<doc>x<b>1</b>y</doc>"
    )


def test_replace_element_ignores_whitespace_around_the_replacement() -> None:
    patch = '<diff><replace sel="doc/a">\n    <b/>\n  </replace></diff>'
    assert patched("<doc>\n  <a/>\n</doc>", patch) == "<doc>\n  <b/>\n</doc>"


def test_replace_root_element_keeps_comments_around_it() -> None:
    patch = '<diff><replace sel="doc"><new><x/></new></replace></diff>'
    assert (
        patched("<!--c--><doc><a/></doc><?pi end?>", patch) == "<!--c--><new><x/></new><?pi end?>"
    )


def test_replace_attribute_value() -> None:
    assert patched('<doc a="1"/>', '<diff><replace sel="doc/@a">new value</replace></diff>') == (
        '<doc a="new value"/>'
    )


def test_replace_attribute_with_nothing_makes_it_empty() -> None:
    assert patched('<doc a="1"/>', '<diff><replace sel="doc/@a"/></diff>') == '<doc a=""/>'


def test_replace_text_node() -> None:
    patch = '<diff><replace sel="doc/a/text()[1]">new</replace></diff>'
    assert patched("<doc><a>old<b/>keep</a></doc>", patch) == "<doc><a>new<b/>keep</a></doc>"


def test_replace_tail_text_node() -> None:
    patch = '<diff><replace sel="doc/a/text()[2]">new</replace></diff>'
    assert patched("<doc><a>keep<b/>old</a></doc>", patch) == "<doc><a>keep<b/>new</a></doc>"


def test_replace_text_node_with_nothing_removes_it() -> None:
    assert patched("<doc><a>old</a></doc>", '<diff><replace sel="doc/a/text()"/></diff>') == (
        "<doc><a/></doc>"
    )


def test_replace_comment() -> None:
    patch = '<diff><replace sel="doc/comment()[1]"><!-- new --></replace></diff>'
    assert patched("<doc><!-- old -->x</doc>", patch) == "<doc><!-- new -->x</doc>"


def test_replace_processing_instruction() -> None:
    patch = "<diff><replace sel=\"doc/processing-instruction('old')\"><?new a?></replace></diff>"
    assert patched("<doc><?old?>x</doc>", patch) == "<doc><?new a?>x</doc>"


def test_replace_comment_before_the_root_element() -> None:
    patch = '<diff><replace sel="comment()"><!-- new --></replace></diff>'
    assert patched("<!-- old --><doc/>", patch) == "<!-- new --><doc/>"


def test_replace_namespace_uri_moves_the_names_bound_through_the_declaration() -> None:
    # RFC 5261 section 4.4.3 with errata 3478.
    patch = '<diff><replace sel="doc/namespace::p">urn:new</replace></diff>'
    result = patched('<doc xmlns:p="urn:old"><p:a p:n="1"/><b/></doc>', patch)
    assert result == '<doc xmlns:p="urn:new"><p:a p:n="1"/><b/></doc>'
    assert etree.fromstring(result)[0].tag == "{urn:new}a"


def test_replace_namespace_uri_leaves_names_under_a_nearer_declaration_alone() -> None:
    patch = '<diff><replace sel="doc/namespace::q">urn:new</replace></diff>'
    result = patched('<doc xmlns:q="urn:old"><q:a><q:b xmlns:q="urn:other"/></q:a></doc>', patch)
    assert result == '<doc xmlns:q="urn:new"><q:a><q:b xmlns:q="urn:other"/></q:a></doc>'


# ---------------------------------------------------------------------------------------------
# <remove> (RFC 5261 section 4.5)


def test_remove_element_joins_the_text_around_it() -> None:
    assert patched("<doc>x<a/>y</doc>", '<diff><remove sel="doc/a"/></diff>') == "<doc>xy</doc>"


def test_remove_with_ws_before_removes_the_preceding_whitespace() -> None:
    patch = '<diff><remove sel="doc/b" ws="before"/></diff>'
    assert patched("<doc>\n  <a/>\n  <b/>\n</doc>", patch) == "<doc>\n  <a/>\n</doc>"


def test_remove_with_ws_after_removes_the_following_whitespace() -> None:
    patch = '<diff><remove sel="doc/a" ws="after"/></diff>'
    assert patched("<doc>\n  <a/>\n  <b/>\n</doc>", patch) == "<doc>\n  <b/>\n</doc>"


def test_remove_with_ws_both_removes_surrounding_whitespace() -> None:
    patch = '<diff><remove sel="doc/a" ws="both"/></diff>'
    assert patched("<doc>x<b/> <a/>\t<c/></doc>", patch) == "<doc>x<b/><c/></doc>"


def test_remove_comment_with_ws_after() -> None:
    patch = '<diff><remove sel="doc/comment()" ws="after"/></diff>'
    assert patched("<doc><a/><!-- c -->\n</doc>", patch) == "<doc><a/></doc>"


def test_remove_attribute() -> None:
    assert patched('<doc a="1" b="2"/>', '<diff><remove sel="doc/@a"/></diff>') == '<doc b="2"/>'


def test_remove_text_node() -> None:
    assert patched("<doc><a>x</a></doc>", '<diff><remove sel="doc/a/text()"/></diff>') == (
        "<doc><a/></doc>"
    )


def test_remove_processing_instruction() -> None:
    patch = "<diff><remove sel=\"doc/processing-instruction('p')\"/></diff>"
    assert patched("<doc>a<?p?>b</doc>", patch) == "<doc>ab</doc>"


def test_remove_comment_before_the_root_element() -> None:
    assert patched("<!--c--><doc/>", '<diff><remove sel="comment()[1]"/></diff>') == "<doc/>"


def test_remove_namespace_declaration() -> None:
    patch = '<diff><remove sel="doc/a/namespace::p"/></diff>'
    assert patched('<doc><a xmlns:p="urn:p">x<b/></a>y</doc>', patch) == "<doc><a>x<b/></a>y</doc>"


# ---------------------------------------------------------------------------------------------
# Selectors (RFC 5261 sections 4.1 and 4.2)


def test_relative_selector_starts_at_the_document_root_node() -> None:
    # RFC 5261 section 4.1: `comment()` is the comment child of the root node (before <doc>),
    # not the one inside <doc>, and `doc` is the root element.
    patch = '<diff><remove sel="comment()"/><add sel="doc" type="@a">1</add></diff>'
    assert patched("<!--c--><doc><!--inner--></doc>", patch) == '<doc a="1"><!--inner--></doc>'


def test_selector_prefixes_resolve_in_scope_of_the_operation_element() -> None:
    patch = '<diff xmlns:x="urn:other"><remove xmlns:x="urn:x" sel="doc/x:a"/></diff>'
    assert patched('<doc xmlns:p="urn:x"><p:a/><b/></doc>', patch) == (
        '<doc xmlns:p="urn:x"><b/></doc>'
    )


def test_unprefixed_selector_names_use_the_patch_default_namespace() -> None:
    # RFC 5261 section 4.2.1 (a departure from XPath 1.0); A.18 relies on it.
    patch = '<diff xmlns="urn:d"><remove sel="doc/a[@n=\'1\']"/></diff>'
    assert patched('<doc xmlns="urn:d"><a n="1"/><a n="2"/></doc>', patch) == (
        '<doc xmlns="urn:d"><a n="2"/></doc>'
    )


def test_unprefixed_selector_names_without_default_namespace_match_no_namespace() -> None:
    patch = '<diff><add sel="doc/*/bar" pos="prepend"><c/></add></diff>'
    assert patched('<doc><a><bar/></a><x xmlns="urn:t"><bar/></x></doc>', patch) == (
        '<doc><a><bar><c/></bar></a><x xmlns="urn:t"><bar/></x></doc>'
    )


def test_selectors_may_use_every_predicate_of_the_rfc_5261_grammar() -> None:
    doc = '<doc><b n="1">1<k>x</k></b><b n="2">2<k>y</k></b><b n="3">3</b><c/></doc>'
    patch = (
        "<diff><replace sel=\"/doc/b[@n='2'][k='y']/text()[1]\">x</replace>"
        "<remove sel=\"doc/b[.='1x']/k\"/>"
        "<add sel=\"doc/b[text()='3']\" type='@m'>1</add>"
        '<remove sel="doc/*[4]"/></diff>'
    )
    assert patched(doc, patch) == (
        '<doc><b n="1">1</b><b n="2">x<k>y</k></b><b n="3" m="1">3</b></doc>'
    )


def test_compiled_selectors_are_reused_for_the_same_selector_and_namespaces() -> None:
    first = compile_patch("<diff><remove sel=\"/doc/a[@n='1']\"/></diff>")
    second = compile_patch("<diff><remove sel=\"/doc/a[@n='1']\"/></diff>")
    other_scope = compile_patch('<diff xmlns="urn:d"><remove sel="/doc/a[@n=\'1\']"/></diff>')
    assert first._operations[0].selector is second._operations[0].selector
    assert first._operations[0].selector is not other_scope._operations[0].selector


def test_compiled_operations_are_shared_by_patches_with_the_same_operation_element() -> None:
    first = compile_patch("<diff><replace sel=\"/doc/a[@n='1']/@v\">2</replace></diff>")
    second = compile_patch(
        "<diff><remove sel='/doc/b'/><replace sel=\"/doc/a[@n='1']/@v\">2</replace></diff>"
    )
    other_value = compile_patch("<diff><replace sel=\"/doc/a[@n='1']/@v\">3</replace></diff>")
    other_scope = compile_patch(
        '<diff xmlns="urn:d"><replace sel="/doc/a[@n=\'1\']/@v">2</replace></diff>'
    )
    assert first._operations[0] is second._operations[1]
    assert first._operations[0] is not other_value._operations[0]
    assert first._operations[0] is not other_scope._operations[0]


def test_a_shared_operation_is_reported_at_its_position_in_each_patch() -> None:
    doc = "<doc><a n='1'/></doc>"
    operation = "<replace sel=\"/doc/a[@n='1']/@v\">2</replace>"
    assert failure(doc, f"<diff>{operation}</diff>").detail.startswith("operation 1 <replace")
    assert failure(doc, f"<diff><remove sel='/doc/a/@n'/>{operation}</diff>").detail.startswith(
        "operation 2 <replace"
    )


# ---------------------------------------------------------------------------------------------
# Selectors are bounded (docs/design.md invariant 6; sis_platform.standards.xpath, limits)

RACE_DOC = MASTER.format(id="ASC-20261121-1430", name="Race 1")


def nested_counts(depth: int) -> str:
    inner = "count(//*)"
    for _ in range(depth - 1):
        inner = f"count(//*[{inner}])"
    return f"/event[{inner}]/@going"


@pytest.mark.parametrize(
    "sel",
    [
        nested_counts(6),
        "/event[count(//*[count(//*)])]/@going",
        "/event" + "[./market[./selection[./price]]]" * 3 + "/@going",
        "//*[@num]/@num",
        "/event/market | " * 50 + "/event",
        "/event[string-length(concat(@id, @id, @id, @id, @id, @id)) > 0]/@going",
        "/event[translate(@going, 'abcdefghij', 'ABCDEFGHIJ')='GOOD']/@going",
        "/event[$x]/@going",
        "/event/market[1e308]/@status",
    ],
    ids=[
        "nested-count",
        "count-in-predicate",
        "deep-predicates",
        "descendant-scan",
        "long-union",
        "string-functions",
        "translate",
        "variable",
        "huge-number",
    ],
)
def test_selectors_outside_the_rfc_5261_grammar_are_refused_when_compiled(sel: str) -> None:
    # Refused by Patch.from_element, before any document is seen: libxml2 never evaluates them.
    with pytest.raises(PatchError) as raised:
        compile_patch(f'<diff><replace sel="{sel}">soft</replace></diff>')
    assert raised.value.error == "invalid-attribute-value"
    assert "RFC 5261 selector subset" in raised.value.detail


def test_selector_at_the_length_limit_applies_and_one_longer_is_too_complex() -> None:
    sel = "/event/@going"
    limits = Limits(max_selector_length=len(sel))
    operations = parse_patch(f'<diff><replace sel="{sel}">soft</replace></diff>'.encode())
    patch = Patch.from_element(operations, limits)
    assert patch.apply(document(RACE_DOC)).getroot().get("going") == "soft"
    with pytest.raises(PatchError) as raised:
        Patch.from_element(operations, Limits(max_selector_length=len(sel) - 1))
    assert (raised.value.error, raised.value.detail) == (
        "too-complex",
        "operation 1 <replace sel='/event/@going'>: sel is 13 characters, over the limit of 12 "
        "(SIS_MAX_SELECTOR_LENGTH)",
    )


def test_selector_at_the_steps_limit_applies_and_one_more_predicate_is_too_complex() -> None:
    sel = "/event/market[@id='WIN']/selection[@id='7']/price/@num"  # 5 steps, 2 predicates
    operations = parse_patch(f'<diff><replace sel="{sel}">9</replace></diff>'.encode())
    patch = Patch.from_element(operations, Limits(max_selector_steps=7))
    price = patch.apply(document(RACE_DOC)).getroot().find("market/selection[2]/price")
    assert price is not None and price.get("num") == "9"
    with pytest.raises(PatchError) as raised:
        Patch.from_element(operations, Limits(max_selector_steps=6))
    assert raised.value.error == "too-complex"
    assert raised.value.detail.endswith(
        "sel has 7 or more location steps and predicates, over the limit of 6 "
        "(SIS_MAX_SELECTOR_STEPS)"
    )


def test_a_selector_refused_for_its_length_is_quoted_shortened_in_the_detail() -> None:
    sel = "/event" + "/market" * 1000
    with pytest.raises(PatchError) as raised:
        compile_patch(f'<diff><remove sel="{sel}"/></diff>')
    assert raised.value.error == "too-complex"
    assert f"sel is {len(sel)} characters" in raised.value.detail
    assert len(raised.value.detail) < 400


def test_compiled_operations_are_not_shared_across_limits() -> None:
    operations = parse_patch(b'<diff><replace sel="/event/@going">soft</replace></diff>')
    assert len(Patch.from_element(operations)) == 1
    with pytest.raises(PatchError) as raised:
        Patch.from_element(operations, Limits(max_selector_steps=1))
    assert raised.value.error == "too-complex"


def test_patch_error_accepts_too_complex_the_item_reason_for_a_bound() -> None:
    error = pickle.loads(pickle.dumps(PatchError("too-complex", "why")))
    assert (error.error, error.detail) == (Reason.TOO_COMPLEX, "why")


@pytest.mark.parametrize(
    ("sel", "limits", "reason"),
    [
        (nested_counts(6), DEFAULT_LIMITS, Reason.INVALID_ATTRIBUTE_VALUE),
        ("/event/@going", Limits(max_selector_length=5), Reason.TOO_COMPLEX),
    ],
    ids=["count-attack", "over-a-bound"],
)
def test_an_update_with_a_refused_selector_is_dead_lettered_and_the_master_goes_stale(
    sel: str, limits: Limits, reason: Reason
) -> None:
    master_id = "ASC-20261121-1430"
    body = (
        f'<sportsdata category="master" type="new" id="{master_id}" '
        f'sent="2026-11-21T12:00:00Z">{RACE_DOC}</sportsdata>'
    ).encode()
    master = split_message(f"ID:{1:048x}", parse_message(body))
    update = split_message(
        f"ID:{2:048x}",
        parse_message(
            f'<sportsdata category="update" id="{master_id}" sent="2026-11-21T12:00:01Z">'
            f'<replace sel="{sel}">soft</replace></sportsdata>'.encode()
        ),
    )
    result = fold_master(master_id, None, master + update, patches=PatchCache(limits))
    refused = result.results[-1]
    assert (refused.outcome, refused.reason) == (Outcome.DEAD_LETTERED, reason)
    assert result.state.stale and result.state.version == 1


# ---------------------------------------------------------------------------------------------
# Errors (RFC 5261 section 5), one or more triggers each


@pytest.mark.parametrize(
    "patch",
    [
        "<diff><add><a/></add></diff>",
        '<diff><remove sel="  "/></diff>',
        '<diff><add sel="doc" pos="under"><a/></add></diff>',
        '<diff><remove sel="doc/a" ws="around"/></diff>',
        '<diff><add sel="doc" type="wrong">x</add></diff>',
        '<diff><add sel="doc" type="@xmlns:p">urn:p</add></diff>',
        '<diff><remove sel="doc/a["/></diff>',
        '<diff><remove sel="count(doc)"/></diff>',
        '<diff><remove sel="$var"/></diff>',
        '<diff xmlns:f="urn:f"><remove sel="doc/a[f:g()]"/></diff>',
    ],
    ids=[
        "missing-sel",
        "blank-sel",
        "bad-pos",
        "bad-ws",
        "bad-type",
        "xmlns-attribute",
        "xpath-syntax",
        "not-a-node-set",
        "variable",
        "extension-function",
    ],
)
def test_invalid_attribute_values_are_invalid_attribute_value(patch: str) -> None:
    assert failure("<doc><a/></doc>", patch).error == "invalid-attribute-value"


def test_patch_and_document_in_different_encodings_is_invalid_character_set() -> None:
    doc = document("<doc/>")
    patch = Patch.from_element(parse_patch(b'<?xml version="1.0" encoding="ISO-8859-1"?><diff/>'))
    with pytest.raises(PatchError) as raised:
        patch.apply(doc)
    assert raised.value.error == "invalid-character-set"


def test_same_encoding_spelled_differently_is_the_same_character_set() -> None:
    patch = Patch.from_element(parse_patch(b'<?xml version="1.0" encoding="utf8"?><diff/>'))
    utf8 = etree.fromstring(b'<?xml version="1.0" encoding="UTF-8"?><doc/>').getroottree()
    assert etree.tostring(patch.apply(utf8)) == b"<doc/>"


def test_patch_that_is_not_well_formed_is_invalid_diff_format() -> None:
    with pytest.raises(PatchError) as raised:
        parse_patch(b'<diff><add sel="a"><c></add></diff>')
    assert raised.value.error == "invalid-diff-format"


def test_malformed_patch_after_an_entity_error_is_still_invalid_diff_format() -> None:
    # lxml's exception log is per thread; the classification must use this parse's errors.
    with pytest.raises(PatchError):
        parse_patch(b"<diff>&undeclared;</diff>")
    with pytest.raises(PatchError) as raised:
        parse_patch(b"<diff><add></diff>")
    assert raised.value.error == "invalid-diff-format"


def test_text_between_operations_is_invalid_diff_format() -> None:
    assert failure("<doc/>", '<diff>stray<remove sel="doc/a"/></diff>').error == (
        "invalid-diff-format"
    )


def test_undeclared_entity_in_the_patch_is_invalid_entity_declaration() -> None:
    with pytest.raises(PatchError) as raised:
        parse_patch(b'<diff><add sel="a">&undeclared;</add></diff>')
    assert raised.value.error == "invalid-entity-declaration"


def test_entities_are_never_expanded_even_when_declared() -> None:
    # Declared entities, internal or external (XXE), stay unexpanded references, which the
    # engine refuses rather than guess at.
    for declaration in ('<!ENTITY e "v">', '<!ENTITY e SYSTEM "file:///etc/passwd">'):
        root = parse_patch(
            f'<!DOCTYPE diff [{declaration}]><diff><add sel="doc">&e;</add></diff>'.encode()
        )
        with pytest.raises(PatchError) as raised:
            Patch.from_element(root)
        assert raised.value.error == "invalid-entity-declaration"


def test_external_dtd_of_a_patch_is_not_fetched() -> None:
    root = parse_patch(
        b'<!DOCTYPE diff SYSTEM "http://example.invalid/diff.dtd">'
        b'<diff><add sel="doc" type="@a">1</add></diff>'
    )
    assert etree.tostring(Patch.from_element(root).apply(document("<doc/>"))) == b'<doc a="1"/>'


@pytest.mark.parametrize(
    ("doc", "patch"),
    [
        ("<doc><a/></doc>", '<diff><remove sel="doc/p:a"/></diff>'),
        ("<doc/>", '<diff><add sel="doc" type="@p:n">v</add></diff>'),
        ('<doc xmlns:p="urn:p"/>', '<diff><add sel="doc" type="namespace::p">urn:q</add></diff>'),
        ("<doc/>", '<diff><add sel="doc" type="namespace::xml">urn:q</add></diff>'),
        (
            '<doc xmlns:p="urn:p"><a><p:b/></a></doc>',
            '<diff><add sel="doc/a" type="namespace::p">urn:q</add></diff>',
        ),
    ],
    ids=[
        "undeclared-in-sel",
        "undeclared-in-type",
        "already-declared",
        "reserved-prefix",
        "redeclaring-a-used-prefix",
    ],
)
def test_unresolvable_or_clashing_prefixes_are_invalid_namespace_prefix(
    doc: str, patch: str
) -> None:
    assert failure(doc, patch).error == "invalid-namespace-prefix"


@pytest.mark.parametrize(
    ("doc", "patch"),
    [
        ("<doc/>", '<diff><add sel="doc" type="namespace::p"/></diff>'),
        ('<doc xmlns:p="urn:p"/>', '<diff><replace sel="doc/namespace::p"/></diff>'),
        (
            "<doc/>",
            '<diff><add sel="doc" type="namespace::p">http://www.w3.org/2000/xmlns/</add></diff>',
        ),
        ("<doc/>", '<diff><add sel="doc" type="namespace::p">urn: x</add></diff>'),
        ("<doc/>", '<diff><add sel="doc" type="namespace::p">relative/path</add></diff>'),
    ],
    ids=["add-empty", "replace-empty", "reserved-uri", "whitespace", "relative"],
)
def test_unusable_namespace_uris_are_invalid_namespace_uri(doc: str, patch: str) -> None:
    assert failure(doc, patch).error == "invalid-namespace-uri"


@pytest.mark.parametrize(
    ("doc", "patch"),
    [
        ("<doc><a/></doc>", '<diff><replace sel="doc/a">text</replace></diff>'),
        ("<doc><a/></doc>", '<diff><replace sel="doc/a"><b/><c/></replace></diff>'),
        ("<doc><a/></doc>", '<diff><replace sel="doc/a"><!-- c --></replace></diff>'),
        ('<doc a="1"/>', '<diff><replace sel="doc/@a"><b/></replace></diff>'),
        ("<doc>x</doc>", '<diff><replace sel="doc/text()"><b/></replace></diff>'),
        ("<doc><!--c--></doc>", '<diff><replace sel="doc/comment()"><?pi?></replace></diff>'),
        ("<doc/>", '<diff><add sel="doc" type="@a"><b/></add></diff>'),
        ("<doc>x</doc>", '<diff><add sel="doc/text()" type="@a">1</add></diff>'),
        ("<doc>x</doc>", '<diff><add sel="doc/text()"><b/></add></diff>'),
        ('<doc a="1"/>', '<diff><add sel="doc/@a" pos="after"><b/></add></diff>'),
    ],
    ids=[
        "element-by-text",
        "element-by-two-elements",
        "element-by-comment",
        "attribute-by-element",
        "text-by-element",
        "comment-by-pi",
        "attribute-content-not-text",
        "attribute-on-text-node",
        "children-of-text-node",
        "sibling-of-attribute",
    ],
)
def test_mismatched_node_types_are_invalid_node_types(doc: str, patch: str) -> None:
    assert failure(doc, patch).error == "invalid-node-types"


@pytest.mark.parametrize(
    ("doc", "patch"),
    [
        ("<doc/>", '<diff><move sel="doc"/></diff>'),
        ("<doc><a/></doc>", '<diff><remove msel="doc/a"/></diff>'),
        ("<doc/>", '<diff><replace sel="doc" pos="before"><a/></replace></diff>'),
        ("<doc><a/></doc>", '<diff><remove sel="doc/a">content</remove></diff>'),
        ("<doc/>", '<diff><add sel="doc" type="@a" pos="before">1</add></diff>'),
        ('<doc xmlns:p="urn:p"><p:a/></doc>', '<diff><remove sel="doc/namespace::p"/></diff>'),
    ],
    ids=[
        "unknown-operation",
        "unknown-attribute",
        "attribute-of-another-operation",
        "remove-with-content",
        "pos-with-type",
        "remove-namespace-in-use",
    ],
)
def test_directives_that_cannot_be_fulfilled_are_invalid_patch_directive(
    doc: str, patch: str
) -> None:
    assert failure(doc, patch).error == "invalid-patch-directive"


@pytest.mark.parametrize(
    "patch",
    [
        '<diff><remove sel="doc"/></diff>',
        '<diff><add sel="doc" pos="before"><other/></add></diff>',
        '<diff><add sel="doc" pos="after"><!-- ok --><other/></add></diff>',
    ],
    ids=["remove-root", "element-before-root", "element-after-root"],
)
def test_root_element_removal_or_siblings_are_invalid_root_element_operation(patch: str) -> None:
    assert failure("<doc/>", patch).error == "invalid-root-element-operation"


def test_text_outside_the_root_element_is_invalid_xml_prolog_operation() -> None:
    assert failure("<doc/>", '<diff><add sel="doc" pos="before">text</add></diff>').error == (
        "invalid-xml-prolog-operation"
    )


@pytest.mark.parametrize(
    ("doc", "ws"),
    [
        ("<doc><b/><a/> </doc>", "before"),
        ("<doc> <a/><b/></doc>", "after"),
        ("<doc> <a/>x</doc>", "both"),
        ("<doc>x<a/> </doc>", "both"),
    ],
)
def test_ws_without_an_adjacent_whitespace_node_is_invalid_whitespace_directive(
    doc: str, ws: str
) -> None:
    patch = f'<diff><remove sel="doc/a" ws="{ws}"/></diff>'
    assert failure(doc, patch).error == "invalid-whitespace-directive"


@pytest.mark.parametrize(
    ("doc", "sel"),
    [
        ('<doc a="1"/>', "doc/@a"),
        ("<doc> x </doc>", "doc/text()"),
        ('<doc xmlns:p="urn:p"/>', "doc/namespace::p"),
        ("<!--c--><doc/>", "comment()"),
    ],
    ids=["attribute", "text", "namespace", "outside-root"],
)
def test_ws_on_a_node_without_whitespace_siblings_is_invalid_whitespace_directive(
    doc: str, sel: str
) -> None:
    patch = f'<diff><remove sel="{sel}" ws="both"/></diff>'
    assert failure(doc, patch).error == "invalid-whitespace-directive"


@pytest.mark.parametrize(
    ("doc", "sel"),
    [
        ("<doc><a/></doc>", "doc/b"),
        ("<doc><a/><a/></doc>", "doc/a"),
        ('<doc xmlns:p="urn:p"><a/></doc>', "doc/a/namespace::p"),
        ("<doc><a/></doc>", "doc/namespace::p"),
        ("<doc><a/></doc>", "doc/namespace::xml"),
        ('<doc xmlns="urn:d"><a/></doc>', "doc/a"),
    ],
    ids=[
        "no-match",
        "two-matches",
        "inherited-namespace",
        "undeclared-namespace",
        "namespace-nodes",
        "namespaced-target",
    ],
)
def test_selectors_not_locating_exactly_one_node_are_unlocated_node(doc: str, sel: str) -> None:
    assert failure(doc, f'<diff><remove sel="{sel}"/></diff>').error == "unlocated-node"


def test_id_function_is_unsupported_id_function() -> None:
    doc = '<!DOCTYPE doc [<!ATTLIST a id ID #IMPLIED>]><doc><a id="k"/></doc>'
    assert failure(doc, "<diff><remove sel=\"id('k')\"/></diff>").error == (
        "unsupported-id-function"
    )


def test_id_function_addressing_an_xml_id_is_unsupported_xml_id() -> None:
    doc = '<doc><a xml:id="k"/></doc>'
    assert failure(doc, "<diff><remove sel=\"id('k')\"/></diff>").error == "unsupported-xml-id"


def test_error_detail_names_the_operation_and_the_reason() -> None:
    error = failure(
        "<doc><a/><a/></doc>", '<diff><add sel="doc" type="@x">1</add><remove sel="doc/a"/></diff>'
    )
    assert error.detail == (
        "operation 2 <remove sel='doc/a'>: sel matches 2 nodes, it must match exactly one"
    )


# ---------------------------------------------------------------------------------------------
# Patches of attributes only: each element path is located once per application


RACE = (
    "<event id='E'><market id='WIN' status='open'>"
    "<selection id='1'><price num='2' den='1'/></selection>"
    "<selection id='2'><price num='3' den='1'/></selection>"
    "</market><market id='PLACE' status='open'/></event>"
)


def test_attribute_patch_sets_several_attributes_of_one_element() -> None:
    patch = (
        "<diff><replace sel=\"/event/market[@id='WIN']/selection[@id='2']/price/@num\">9</replace>"
        "<replace sel=\"/event/market[@id='WIN']/selection[@id='2']/price/@den\">4</replace>"
        "<remove sel=\"/event/market[@id='PLACE']/@status\"/></diff>"
    )
    result = patched(RACE, patch)
    assert '<selection id="2"><price num="9" den="4"/></selection>' in result
    assert '<market id="PLACE"/>' in result


def test_attribute_removed_by_an_earlier_operation_is_not_located_again() -> None:
    patch = (
        "<diff><remove sel=\"/event/market[@id='WIN']/@status\"/>"
        "<replace sel=\"/event/market[@id='WIN']/@status\">closed</replace></diff>"
    )
    error = failure(RACE, patch)
    assert error.error == "unlocated-node"
    assert error.detail.startswith("operation 2 ")


def test_attribute_selector_matching_several_elements_is_unlocated_node() -> None:
    doc = RACE.replace("id='PLACE'", "id='WIN'")
    error = failure(
        doc, "<diff><replace sel=\"/event/market[@id='WIN']/@status\">x</replace></diff>"
    )
    assert error.detail.endswith("sel matches 2 nodes, it must match exactly one")


def test_attribute_patch_that_changes_a_key_its_selectors_read_sees_the_change() -> None:
    # The first operation moves market WIN to id W2: the second selector must find it there.
    patch = (
        "<diff><replace sel=\"/event/market[@id='WIN']/@id\">W2</replace>"
        "<replace sel=\"/event/market[@id='W2']/@status\">closed</replace></diff>"
    )
    assert '<market id="W2" status="closed">' in patched(RACE, patch)


def test_attribute_patch_applies_in_place_as_it_applies_to_a_copy() -> None:
    patch = compile_patch(
        "<diff><replace sel=\"/event/market[@id='WIN']/selection[@id='1']/price/@num\">5</replace>"
        "<remove sel=\"/event/market[@id='WIN']/selection[@id='1']/price/@den\"/></diff>"
    )
    original = document(RACE)
    copied = etree.tostring(patch.apply(original))
    assert etree.tostring(original) == etree.tostring(document(RACE))  # apply copies
    assert etree.tostring(patch.apply_in_place(original)) == copied
    assert etree.tostring(original) == copied  # apply_in_place does not


def test_attribute_patches_of_a_simulated_day_give_what_evaluating_every_selector_gives() -> None:
    # Both ways on every update of a day with invalid patches among them: the same document
    # or the same error and detail.
    invalid = {str(reason): 0.01 for reason in INVALID_REASONS}
    masters: dict[str, bytes] = {}
    fast = 0
    for simulated in generate_feed(11, 3000, invalid=invalid):
        classified = classify_message(LoggedMessage(simulated.message_id, simulated.body))
        if isinstance(classified, DeadLetter):
            continue
        for item in classified:
            if item.category == "master":
                masters[item.master_id] = item.payload
                continue
            if item.master_id not in masters:
                continue
            patch = Patch.from_element(parse_xml(item.payload))
            slow = Patch.from_element(parse_xml(item.payload))
            slow._attributes_only = False
            fast += patch._attributes_only
            outcomes = []
            for each in (patch, slow):
                try:
                    tree = each.apply_in_place(parse_xml(masters[item.master_id]).getroottree())
                    outcomes.append(etree.tostring(tree))
                except PatchError as error:
                    outcomes.append(f"{error.error}: {error.detail}".encode())
            assert outcomes[0] == outcomes[1]
            if not outcomes[0].startswith(b"<"):
                continue
            masters[item.master_id] = outcomes[0]
    assert fast > 1000


def test_in_place_application_reports_the_located_elements_of_an_attribute_patch() -> None:
    price = "/event/market[@id='WIN']/selection[@id='1']/price"
    located: dict[str, list[etree._Element]] = {}
    tree = compile_patch(f'<diff><replace sel="{price}/@num">7</replace></diff>').apply_in_place(
        document(RACE), located
    )
    assert list(located) == [price]
    assert located[price] == tree.xpath(price)
    other: dict[str, list[etree._Element]] = {}
    compile_patch(f'<diff><remove sel="{price}"/></diff>').apply_in_place(document(RACE), other)
    assert other == {}  # not an attribute patch: nothing is reported
