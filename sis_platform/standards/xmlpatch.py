"""RFC 5261 XML patch operations (<add>, <replace>, <remove>) with XPath selectors, over lxml.

`Patch.from_element` compiles the operation elements found under a parent element (a `<diff>`,
or a `<sportsdata category="update">`: the parent's name does not matter, RFC 5261 leaves it to
the using application) and `Patch.apply` applies them, in document order, to a copy of a
document. Application is atomic: the first failing operation raises `PatchError` carrying the
RFC 5261 section 5 error element name, and the input document is never modified.

Decisions where RFC 5261 is silent or its peers disagree (each is cited where it is coded):
- Selectors are the location paths of RFC 5261's own grammar (section 8 schema), parsed by
  sis_platform.standards.xpath before anything evaluates them: child steps by name with
  position, attribute, child, `.` or `text()` equality predicates, ending in an element,
  attribute, namespace, text, comment or processing-instruction step. General XPath (`//`,
  other axes, functions, operators, unions, variables) is `invalid-attribute-value`, and a
  selector over a bound of its `SelectorLimits` is `too-complex`: evaluation then costs
  at most the selector's steps times the document, whatever its bytes (docs/design.md invariant 6).
  The parsed path is rendered to an XPath 1.0 expression libxml2 evaluates, with RFC 5261
  section 4.1/4.2 semantics on top: the context node is the document root node, the selector
  must locate exactly one node (else `unlocated-node`), prefixes resolve against the
  namespace declarations in scope on the operation element, and an unprefixed element name
  matches the default namespace in scope on the operation element, if there is one (section
  4.2.1; the A.18 example depends on it; errata 3477). `id()` is not supported
  (`unsupported-id-function`), and addressing an `xml:id` through it reports
  `unsupported-xml-id`.
- Element, comment and processing-instruction replacement ignores whitespace-only text around
  the single replacement node (pretty-printed patches, A.6); text in `<add>` content is copied
  verbatim, whitespace included (section 4.3, A.5). A `<replace>`'s content is checked against
  the node its selector locates, so a selector that locates nothing is reported first.
- `ws` on an attribute, text or namespace removal is `invalid-whitespace-directive`: such a
  node never has an adjacent whitespace text node to remove.
- A missing namespace declaration on the selected element is `unlocated-node` (section 4.4.3:
  the selected element must be the parent of the declaration); removing a declaration whose
  prefix is still used is `invalid-patch-directive` (section 4.5).
- Replacing the root element is allowed (section 5 only forbids removing it and adding element
  siblings); text added outside the root element is `invalid-xml-prolog-operation`.
- `<add type="@name">` on an attribute that exists sets its value (XML allows one attribute of
  a name; both peer implementations do the same).
- Documents and patches must declare the same character encoding (`invalid-character-set`).
- Namespace mangling (section 4.2.3): added content keeps its namespaces but reuses the
  target's prefixes for them; unqualified content added under a default namespace gets an
  `xmlns=""` undeclaration so that it stays unqualified when serialized.
"""

from __future__ import annotations

import codecs
import copy
import re
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, TypeAlias, cast

from lxml import etree

from sis_platform.standards.xpath import (
    DEFAULT_SELECTOR_BOUNDS,
    NCNAME,
    AttributeEquals,
    AttributeStep,
    ChildEquals,
    LocationPath,
    NamespaceStep,
    QName,
    SelectorLimits,
    SelectorSyntaxError,
    SelectorTooComplex,
    literal,
    parse_selector,
    render_last,
    render_steps,
)

__all__ = [
    "ERROR_NAMES",
    "Patch",
    "PatchError",
    "apply_patch",
    "in_scope",
    "in_scope_of",
    "parse_patch",
]

# RFC 5261 section 5 error elements.
INVALID_ATTRIBUTE_VALUE: Final = "invalid-attribute-value"
INVALID_CHARACTER_SET: Final = "invalid-character-set"
INVALID_DIFF_FORMAT: Final = "invalid-diff-format"
INVALID_ENTITY_DECLARATION: Final = "invalid-entity-declaration"
INVALID_NAMESPACE_PREFIX: Final = "invalid-namespace-prefix"
INVALID_NAMESPACE_URI: Final = "invalid-namespace-uri"
INVALID_NODE_TYPES: Final = "invalid-node-types"
INVALID_PATCH_DIRECTIVE: Final = "invalid-patch-directive"
INVALID_ROOT_ELEMENT_OPERATION: Final = "invalid-root-element-operation"
INVALID_XML_PROLOG_OPERATION: Final = "invalid-xml-prolog-operation"
INVALID_WHITESPACE_DIRECTIVE: Final = "invalid-whitespace-directive"
UNLOCATED_NODE: Final = "unlocated-node"
UNSUPPORTED_ID_FUNCTION: Final = "unsupported-id-function"
UNSUPPORTED_XML_ID: Final = "unsupported-xml-id"

ERROR_NAMES: Final[frozenset[str]] = frozenset(
    {
        INVALID_ATTRIBUTE_VALUE,
        INVALID_CHARACTER_SET,
        INVALID_DIFF_FORMAT,
        INVALID_ENTITY_DECLARATION,
        INVALID_NAMESPACE_PREFIX,
        INVALID_NAMESPACE_URI,
        INVALID_NODE_TYPES,
        INVALID_PATCH_DIRECTIVE,
        INVALID_ROOT_ELEMENT_OPERATION,
        INVALID_XML_PROLOG_OPERATION,
        INVALID_WHITESPACE_DIRECTIVE,
        UNLOCATED_NODE,
        UNSUPPORTED_ID_FUNCTION,
        UNSUPPORTED_XML_ID,
    }
)

# Not an RFC 5261 error: a selector over a resource bound (sis_platform.domain.limits), reported
# with the name of the item reason it becomes (sis_platform.domain.reasons.Reason.TOO_COMPLEX).
TOO_COMPLEX: Final = "too-complex"

XML_NAMESPACE: Final = "http://www.w3.org/XML/1998/namespace"
XMLNS_NAMESPACE: Final = "http://www.w3.org/2000/xmlns/"


class PatchError(Exception):
    """An RFC 5261 patch failure: `error` is the section 5 error element name, or `too-complex`
    for a selector over a bound of its `SelectorLimits`."""

    error: str
    detail: str

    def __init__(self, error: str, detail: str) -> None:
        if error not in ERROR_NAMES and error != TOO_COMPLEX:
            raise ValueError(f"not an RFC 5261 error element name: {error!r}")
        # Both in args, so the exception pickles (Spark ships exceptions between processes).
        super().__init__(error, detail)
        self.error = error
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.error}: {self.detail}"


# ---------------------------------------------------------------------------------------------
# Parsing patch documents


def parse_patch(data: bytes | str) -> etree._Element:
    """Parse a patch document with a hardened parser and return its root element.

    No entity is expanded, no DTD is loaded and nothing is fetched from the network. A document
    that is not well-formed is `invalid-diff-format`; an undeclared entity reference is
    `invalid-entity-declaration`.
    """
    # A parser per call: lxml parsers are not safe to share between threads, and a fresh one
    # has an empty error log.
    parser = etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False
    )
    try:
        return etree.fromstring(data, parser)
    except etree.XMLSyntaxError as error:
        # The parser's own log (error.error_log is the thread's, with earlier documents' errors).
        first = parser.error_log[0] if len(parser.error_log) else None
        if first is not None and "ENTITY" in first.type_name:
            raise PatchError(INVALID_ENTITY_DECLARATION, f"patch document: {error}") from None
        raise PatchError(INVALID_DIFF_FORMAT, f"not well-formed: {error}") from None
    except ValueError as error:  # e.g. a str carrying an encoding declaration
        raise PatchError(INVALID_DIFF_FORMAT, f"cannot parse: {error}") from None


# ---------------------------------------------------------------------------------------------
# Selectors: the RFC 5261 subset (sis_platform.standards.xpath), compiled for libxml2


@dataclass(frozen=True, slots=True)
class _Selector:
    """A compiled `sel` value."""

    source: str
    path: LocationPath
    expression: str  # what libxml2 evaluates (absolute, default namespace made explicit)
    xpath: etree.XPath
    namespace_prefix: str | None  # set for `.../namespace::prefix`: xpath locates the element
    id_values: tuple[str, ...] | None  # set when the selector starts with id()
    # For a plain attribute selector (see _plain_attribute): what xpath selects is attribute
    # `attribute` of the elements `elements` selects; `keys` are the attribute names read by
    # its predicates. None otherwise.
    plain: _PlainAttribute | None = None


@dataclass(frozen=True, slots=True)
class _PlainAttribute:
    element_path: str
    elements: etree.XPath
    attribute: str
    keys: frozenset[str]


def _plain_attribute(path: LocationPath) -> _PlainAttribute | None:
    """The plain form of an attribute selector, or None.

    Plain: child steps naming unprefixed elements, predicates comparing unprefixed attributes
    with literals, then `@name`: the form of the provider's selectors. Without a default
    namespace in scope (RFC 5261 section 4.2.1) the elements such a path selects depend on
    nothing but element names and the values of those attributes.
    """
    last = path.last
    if (
        path.id_values is not None
        or not path.steps
        or not isinstance(last, AttributeStep)
        or last.name.prefix
    ):
        return None
    keys: set[str] = set()
    for step in path.steps:
        if step.name.prefix or step.name.local == "*":
            return None
        for predicate in step.predicates:
            if not isinstance(predicate, AttributeEquals) or predicate.name.prefix:
                return None
            keys.add(predicate.name.local)
    element_path = render_steps(path.steps)
    elements = etree.XPath(element_path)
    return _PlainAttribute(element_path, elements, last.name.local, frozenset(keys))


def _bad_sel(why: str) -> PatchError:
    return PatchError(INVALID_ATTRIBUTE_VALUE, f"sel is not a usable XPath selector: {why}")


def _parsed(sel: str, limits: SelectorLimits) -> LocationPath:
    try:
        return parse_selector(sel, limits)
    except SelectorTooComplex as error:
        raise PatchError(TOO_COMPLEX, str(error)) from None
    except SelectorSyntaxError as error:
        # RFC 5261 section 5: a value that does not match its section 8 schema type (the
        # `xpath` pattern, for sel) is invalid-attribute-value.
        raise _bad_sel(str(error)) from None


def _qnames(path: LocationPath) -> list[QName]:
    """The names in `path` whose prefixes resolve in the patch document."""
    names: list[QName] = []
    for step in path.steps:
        names.append(step.name)
        names.extend(
            p.name for p in step.predicates if isinstance(p, AttributeEquals | ChildEquals)
        )
    if isinstance(path.last, AttributeStep):
        names.append(path.last.name)
    return names


# The namespaces an operation can name: (prefix, URI) pairs, "" for the default namespace.
_Bindings: TypeAlias = "tuple[tuple[str, str], ...]"

# The most characters a key of either compile cache below may hold (a selector, an operation's
# attribute values and text, the namespace URIs they use); a larger one is compiled every time
# and not kept. Each cache holds 4,096 entries, so what one entry keeps stays small whatever
# the messages: a key and its compiled form of a few KiB each, tens of MiB for a full cache.
# The feed's operations are under 200 characters.
CACHED_KEY_CHARS: Final = 4 * 1024


def _key_chars(*parts: str | None) -> int:
    return sum(len(part) for part in parts if part)


def _selector(sel: str, bindings: _Bindings, limits: SelectorLimits) -> _Selector:
    """`sel` compiled for `bindings`, from the cache when its key is small enough to keep."""
    if _key_chars(sel, *(part for binding in bindings for part in binding)) > CACHED_KEY_CHARS:
        return _compile_selector.__wrapped__(sel, bindings, limits)
    return _compile_selector(sel, bindings, limits)


@lru_cache(maxsize=4096)
def _compile_selector(
    sel: str, bindings: _Bindings, limits: SelectorLimits = DEFAULT_SELECTOR_BOUNDS
) -> _Selector:
    """Compile `sel` for an operation element whose in-scope namespaces include `bindings`:
    at least the default namespace and every prefix `sel` names (`_bindings`).

    Cached on (selector, those bindings, limits): an update applies to many masters and feeds
    repeat selectors, while compiling is the expensive part of a selector. The key holds only
    the namespaces the selector can use, not the whole in-scope map, so declarations a message
    makes and never uses neither multiply the entries nor grow them. Only what the RFC
    5261 subset accepts (sis_platform.standards.xpath) reaches libxml2, and it is rendered from
    the parsed path, not passed through: each step selects among the children of the previous
    step's nodes, so evaluation costs at most the step count times the document.
    """
    path = _parsed(sel, limits)
    namespaces = {prefix: uri for prefix, uri in bindings if prefix}
    for name in _qnames(path):
        if name.prefix and name.prefix != "xml" and name.prefix not in namespaces:
            raise PatchError(
                INVALID_NAMESPACE_PREFIX,
                f"sel uses prefix {name.prefix!r}, which the patch document does not declare "
                "(RFC 5261 section 4.2.1)",
            )
    default_uri = next((uri for prefix, uri in bindings if not prefix), "")
    default_prefix: str | None = None
    if default_uri:
        # RFC 5261 section 4.2.1: unprefixed element names use the patch's default namespace
        # (a departure from XPath 1.0, where they would mean no namespace).
        default_prefix = "rfc5261-default"
        while default_prefix in namespaces:
            default_prefix += "-"
        namespaces[default_prefix] = default_uri
    last = path.last
    namespace_prefix = last.prefix if isinstance(last, NamespaceStep) else None
    # RFC 5261 section 4.1: the context node is the document root node, so every path is
    # rendered absolute (lxml would evaluate a relative one from the root element). lxml
    # returns namespace nodes without their element, so a trailing namespace step is resolved
    # by locating the element and reading its declarations.
    expression = render_steps(path.steps, default_prefix)
    if last is not None and not isinstance(last, NamespaceStep):
        expression += "/" + render_last(last)
    if path.id_values is not None:
        expression = f"id({literal(' '.join(path.id_values))}){expression}"
    try:
        xpath = etree.XPath(
            expression or "/", namespaces=namespaces, regexp=False, smart_strings=True
        )
    except etree.XPathSyntaxError as error:  # a name libxml2 reads differently from XML
        raise _bad_sel(str(error)) from None
    plain = _plain_attribute(path) if default_prefix is None else None
    return _Selector(sel, path, expression, xpath, namespace_prefix, path.id_values, plain)


# ---------------------------------------------------------------------------------------------
# Located targets

_XML_IDS = etree.XPath("//@xml:id")


@dataclass(slots=True)
class _Target:
    kind: str  # element, comment, pi, entity, text, attribute, namespace
    node: etree._Element  # the node, or the owner of a text, attribute or namespace node
    name: str = ""  # text: "text" or "tail"; attribute: Clark name; namespace: prefix


def _node_kind(node: etree._Element) -> str:
    tag = node.tag
    if isinstance(tag, str):
        return "element"
    if tag is etree.Comment:
        return "comment"
    if tag is etree.ProcessingInstruction:
        return "pi"
    return "entity"


_KIND_NAMES: Final = {
    "element": "an element",
    "comment": "a comment",
    "pi": "a processing instruction",
    "entity": "an entity reference",
    "text": "a text node",
    "attribute": "an attribute",
    "namespace": "a namespace node",
}


def _unlocated(count: int) -> PatchError:
    # RFC 5261 section 4.1: a selector must locate exactly one node.
    found = "no node" if not count else f"{count} nodes"
    return PatchError(UNLOCATED_NODE, f"sel matches {found}, it must match exactly one")


def _locate(selector: _Selector, tree: etree._ElementTree) -> _Target:
    if selector.id_values is not None:
        values = set(selector.id_values)
        if any(str(value) in values for value in _XML_IDS(tree)):
            raise PatchError(
                UNSUPPORTED_XML_ID,
                "sel addresses an xml:id through id(); xml:id is not supported as an ID "
                "attribute in selectors",
            )
        raise PatchError(
            UNSUPPORTED_ID_FUNCTION,
            "sel uses id(), which is not supported; select by path",
        )
    if selector.namespace_prefix is not None and not selector.path.steps:
        raise PatchError(UNLOCATED_NODE, "the document root node has no namespace nodes")
    try:
        result = selector.xpath(tree)
    except etree.XPathEvalError as error:
        raise _bad_sel(str(error)) from None
    if not isinstance(result, list):
        raise _bad_sel(f"it evaluates to a {type(result).__name__}, not to nodes")
    if len(result) != 1:
        raise _unlocated(len(result))
    node = result[0]
    if selector.namespace_prefix is not None:
        prefix = selector.namespace_prefix
        if not isinstance(node, etree._Element) or _node_kind(node) != "element":
            raise PatchError(
                UNLOCATED_NODE, "sel does not locate an element to search for the namespace"
            )
        if prefix not in _own_namespaces(node):
            # RFC 5261 section 4.4.3: the selected element must be the parent of the
            # namespace declaration; an inherited namespace node is not a patch target.
            raise PatchError(
                UNLOCATED_NODE,
                f"namespace prefix {prefix!r} is not declared on the selected <{node.tag}>",
            )
        return _Target("namespace", node, prefix)
    if isinstance(node, etree._Element):
        return _Target(_node_kind(node), node)
    if isinstance(node, etree._ElementUnicodeResult):
        owner = node.getparent()
        if node.is_attribute:
            return _Target("attribute", owner, str(node.attrname))
        if node.is_text:
            return _Target("text", owner, "text")
        if node.is_tail:
            return _Target("text", owner, "tail")
    raise PatchError(UNLOCATED_NODE, "sel does not select a patchable node")


# ---------------------------------------------------------------------------------------------
# Tree helpers

_XML_SPACE: Final = " \t\r\n"


def _is_whitespace(text: str | None) -> bool:
    """Whether text is a non-empty run of XML whitespace (a whitespace-only text node)."""
    return text is not None and text != "" and not text.strip(_XML_SPACE)


def _own_namespaces(element: etree._Element) -> dict[str, str]:
    """The namespace declarations made on `element` itself ("" is the default namespace)."""
    declared: dict[str, str] = {}
    # iterwalk reports an element's own declarations (start-ns) before its start event.
    for event, value in etree.iterwalk(element, events=("start-ns", "start")):
        if event == "start":
            break
        prefix, uri = value
        declared[prefix] = uri
    return declared


def _get_slot(owner: etree._Element, tail: bool) -> str:
    return (owner.tail if tail else owner.text) or ""


def _set_slot(owner: etree._Element, tail: bool, text: str | None) -> None:
    if tail:
        owner.tail = text or None
    else:
        owner.text = text or None


def _previous_slot(node: etree._Element) -> tuple[etree._Element, bool] | None:
    """The text slot holding the text node just before `node` (None at document level)."""
    previous = node.getprevious()
    if previous is not None:
        return previous, True
    parent = node.getparent()
    if parent is None:
        return None
    return parent, False


def _detach(node: etree._Element) -> None:
    """Remove a child node, keeping its tail text in the document (merged with the text before
    it: the XPath data model has no adjacent text nodes)."""
    parent = node.getparent()
    if parent is None:
        _discard_top_level(node)
        return
    if node.tail:
        slot = _previous_slot(node)
        assert slot is not None
        _set_slot(slot[0], slot[1], _get_slot(*slot) + node.tail)
    parent.remove(node)


def _discard_top_level(node: etree._Element) -> None:
    # lxml has no remove() for siblings of the root element; moving the node into a throwaway
    # element takes it out of the document.
    etree.Element("discarded").append(node)


def _is_root(node: etree._Element) -> bool:
    return node.getparent() is None and node.getroottree().getroot() is node


@dataclass(slots=True)
class _State:
    """The working copy an application mutates; the tree changes when the root is replaced.

    `elements` is set when the patch changes nothing but attributes its selectors do not
    read (Patch._attributes_only): then the elements a plain selector's element steps select
    are the same before and after every operation, so each path is evaluated once per
    application, by element path (an update sets several attributes of one element).
    """

    tree: etree._ElementTree
    elements: dict[str, list[etree._Element]] | None = None


def _locate_in(selector: _Selector, state: _State) -> _Target:
    plain = selector.plain
    if plain is None or state.elements is None:
        return _locate(selector, state.tree)
    elements = state.elements.get(plain.element_path)
    if elements is None:
        # A location path of element steps always evaluates to a node-set of elements.
        elements = cast(list[etree._Element], plain.elements(state.tree))
        state.elements[plain.element_path] = elements
    # XPath's `.../@a` is attribute a of each of those elements that has one: the same count
    # and, when there is one, the same attribute (an earlier operation may have removed or
    # added it, so presence is read now).
    attribute = plain.attribute
    owners = [element for element in elements if element.get(attribute) is not None]
    if len(owners) != 1:
        raise _unlocated(len(owners))
    return _Target("attribute", owners[0], attribute)


def _swap_root(state: _State, new_root: etree._Element) -> etree._Element:
    """Make `new_root` (the root of its own document) the document's root element, keeping the
    comments and processing instructions around the old root."""
    old_root = state.tree.getroot()
    before = list(old_root.itersiblings(preceding=True))
    after = list(old_root.itersiblings())
    old_info = state.tree.docinfo
    new_tree = new_root.getroottree()
    if old_info.doctype:
        new_tree.docinfo.public_id = old_info.public_id
        new_tree.docinfo.system_url = old_info.system_url
    for node in reversed(before):
        new_root.addprevious(node)
    anchor = new_root
    for node in after:
        anchor.addnext(node)
        anchor = node
    state.tree = new_tree
    return new_root


@dataclass(frozen=True, slots=True)
class _Rename:
    """Names bound through `element`'s declaration of `prefix` move from `old` to `new`."""

    element: etree._Element
    prefix: str
    old: str
    new: str


def _rebuild(
    state: _State,
    overrides: dict[etree._Element, dict[str, str]],
    rename: _Rename | None = None,
) -> dict[etree._Element, etree._Element]:
    """Rebuild the document so each element in `overrides` declares exactly the namespaces given
    ("" is the default namespace); returns the new copy of each overridden element.

    lxml cannot change the namespace declarations of an existing element, and moving an element
    drops its declarations of URIs an ancestor already binds (whatever the prefix). So the
    document is rebuilt top-down with Element/SubElement, which declare what they are given and
    move nothing. Namespace operations are rare and masters small; the cost is one copy.
    """
    copies: dict[etree._Element, etree._Element] = {}
    root = _build(state.tree.getroot(), None, overrides, rename, False, copies)
    _swap_root(state, root)
    return copies


def _build(
    source: etree._Element,
    parent: etree._Element | None,
    overrides: dict[etree._Element, dict[str, str]],
    rename: _Rename | None,
    active: bool,
    copies: dict[etree._Element, etree._Element],
) -> etree._Element:
    declarations = overrides.get(source)
    if declarations is None:
        declarations = _own_namespaces(source)
    if rename is not None:
        if source is rename.element:
            active = True
        elif rename.prefix in declarations:
            active = False  # a nearer declaration of the prefix: names below do not use ours
    tag = source.tag
    attrib = dict(source.attrib)
    if active:
        assert rename is not None
        old = f"{{{rename.old}}}"
        if source.prefix == rename.prefix and tag.startswith(old):
            tag = f"{{{rename.new}}}{tag[len(old) :]}"
        if source.nsmap.get(rename.prefix) == rename.old:
            attrib = {
                (f"{{{rename.new}}}{key[len(old) :]}" if key.startswith(old) else key): value
                for key, value in attrib.items()
            }
    nsmap: dict[str | None, str] = {}
    if tag.startswith("{"):
        # First, so lxml gives the element the prefix it had (it takes the first declaration
        # of the element's URI); an inherited binding is not declared again.
        nsmap[source.prefix] = tag[1 : tag.index("}")]
    nsmap.update((prefix or None, uri) for prefix, uri in declarations.items())
    if parent is None:
        built = etree.Element(tag, attrib, nsmap=nsmap)
    else:
        built = etree.SubElement(parent, tag, attrib, nsmap=nsmap)
    if source in overrides:
        copies[source] = built
    built.text = source.text
    for child in source:
        if isinstance(child.tag, str):
            _build(child, built, overrides, rename, active, copies).tail = child.tail
        else:
            leaf = copy.copy(child)
            leaf.tail = child.tail
            built.append(leaf)
    return built


def _fix_unqualified(state: _State, nodes: list[etree._Element]) -> None:
    """Undeclare the default namespace on unqualified elements inserted under one.

    libxml2 keeps such an element in no namespace but serializes it without `xmlns=""`, so it
    would come back in the default namespace when parsed again (RFC 5261 section 4.2.3: added
    content keeps the namespaces it had in the patch).
    """
    offenders = [
        element
        for node in nodes
        if isinstance(node.tag, str)
        for element in node.iter()
        if isinstance(element.tag, str)
        and not element.tag.startswith("{")
        and element.nsmap.get(None)
    ]
    if offenders:
        _rebuild(state, {element: {**_own_namespaces(element), "": ""} for element in offenders})


def _redeclare(
    state: _State, element: etree._Element, declarations: dict[str, str]
) -> etree._Element:
    """Give element exactly `declarations`; returns its copy in the rebuilt document."""
    return _rebuild(state, {element: declarations})[element]


def _prefix_users(element: etree._Element, prefix: str, uri: str) -> str | None:
    """The first node under `element` named through its binding of prefix to uri, if any."""
    stack = [element]
    while stack:
        node = stack.pop()
        if node is not element and prefix in _own_namespaces(node):
            continue  # a nearer declaration of the prefix: nodes below do not use ours
        if node.prefix == prefix and node.tag.startswith(f"{{{uri}}}"):
            return f"<{prefix}:{etree.QName(node).localname}>"
        for key in node.attrib:
            if key.startswith(f"{{{uri}}}") and node.nsmap.get(prefix) == uri:
                return f"attribute {prefix}:{key[len(uri) + 2 :]}"
        stack.extend(child for child in node if isinstance(child.tag, str))
    return None


_ABSOLUTE_URI: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


def _check_namespace_uri(uri: str) -> None:
    if not uri:
        raise PatchError(
            INVALID_NAMESPACE_URI, "a namespace URI cannot be empty for a prefixed declaration"
        )
    if any(char in uri for char in _XML_SPACE) or uri in (XML_NAMESPACE, XMLNS_NAMESPACE):
        raise PatchError(INVALID_NAMESPACE_URI, f"{uri!r} is not a usable namespace URI")
    if _ABSOLUTE_URI.match(uri) is None:
        # Relative namespace URIs are deprecated (W3C, 2000) and break canonical XML.
        raise PatchError(INVALID_NAMESPACE_URI, f"{uri!r} is not an absolute URI")


# ---------------------------------------------------------------------------------------------
# Operations

_Item: TypeAlias = "str | etree._Element"  # a text run, or a detached template node


def _content(operation: etree._Element) -> tuple[_Item, ...]:
    """The content nodes of an operation element, as detached templates."""
    items: list[_Item] = []
    if operation.text:
        items.append(operation.text)
    for child in operation:
        for node in child.iter():
            if isinstance(node, etree._Entity):
                raise PatchError(
                    INVALID_ENTITY_DECLARATION,
                    f"entity reference {node.text} is not expanded: entities are not resolved",
                )
        template = copy.deepcopy(child)
        template.tail = None
        items.append(template)
        if child.tail:
            items.append(child.tail)
    return tuple(items)


def _text_only(items: tuple[_Item, ...], what: str) -> str:
    for item in items:
        if not isinstance(item, str):
            raise PatchError(
                INVALID_NODE_TYPES,
                f"{what} needs text content, found {_KIND_NAMES[_node_kind(item)]}",
            )
    return "".join(item for item in items if isinstance(item, str))


def _single_node(items: tuple[_Item, ...], kind: str) -> etree._Element:
    # Whitespace-only text around the replacement node is layout of the patch document
    # (RFC 5261 A.6 shows a pretty-printed <replace>), not content.
    nodes = [item for item in items if not (isinstance(item, str) and _is_whitespace(item))]
    if len(nodes) == 1 and not isinstance(nodes[0], str) and _node_kind(nodes[0]) == kind:
        return nodes[0]
    if not nodes:
        found = "nothing"
    elif len(nodes) > 1:
        found = f"{len(nodes)} nodes"
    elif isinstance(nodes[0], str):
        found = "text"
    else:
        found = _KIND_NAMES[_node_kind(nodes[0])]
    raise PatchError(
        INVALID_NODE_TYPES,
        f"replacing {_KIND_NAMES[kind]} needs {_KIND_NAMES[kind]} as its only content, "
        f"found {found}",
    )


def _replacement(items: tuple[_Item, ...], kind: str) -> str | etree._Element:
    """What replaces a node of `kind`: its text value or its template node (RFC 5261 4.4)."""
    if kind in ("text", "attribute", "namespace"):
        value = _text_only(items, f"replacing {_KIND_NAMES[kind]}")
        if kind == "namespace":
            _check_namespace_uri(value)
        return value
    if kind == "entity":
        raise PatchError(INVALID_NODE_TYPES, "entity references cannot be replaced")
    return _single_node(items, kind)


class _Operation:
    """A compiled operation: immutable, and independent of its position in the patch, so
    patches share one for the same operation element (see _compiled_operation)."""

    __slots__ = ("name", "selector")

    def __init__(self, name: str, selector: _Selector) -> None:
        self.name = name
        self.selector = selector

    def where(self, index: int) -> str:
        return f"operation {index} <{self.name} sel={self.selector.source!r}>"

    def apply(self, state: _State) -> None:
        raise NotImplementedError


_POSITIONS: Final = frozenset({"before", "after", "prepend"})


class _Add(_Operation):
    __slots__ = ("pos", "attribute", "namespace", "items", "value")

    def __init__(
        self,
        selector: _Selector,
        pos: str | None,
        attribute: tuple[str, str, str] | None,
        namespace: str | None,
        items: tuple[_Item, ...],
        value: str,
    ) -> None:
        super().__init__("add", selector)
        self.pos = pos
        self.attribute = attribute  # (uri, local name, patch prefix) for type="@name"
        self.namespace = namespace  # prefix for type="namespace::prefix"
        self.items = items
        self.value = value  # the text content, for type="@..." and type="namespace::..."

    def apply(self, state: _State) -> None:
        target = _locate(self.selector, state.tree)
        if self.attribute is not None or self.namespace is not None:
            if target.kind != "element":
                raise PatchError(
                    INVALID_NODE_TYPES,
                    f"attributes and namespaces are added to an element, sel located "
                    f"{_KIND_NAMES[target.kind]}",
                )
            if self.attribute is not None:
                self._add_attribute(state, target.node)
            else:
                self._add_namespace(state, target.node)
            return
        self._add_nodes(state, target)

    def _add_attribute(self, state: _State, element: etree._Element) -> None:
        uri, local, prefix = self.attribute  # type: ignore[misc]
        if uri and uri != XML_NAMESPACE:
            bound = {p: u for p, u in element.nsmap.items() if p}  # attributes need a prefix
            if uri not in bound.values() and prefix not in bound:
                # Keep the patch's prefix when the target has none for the namespace (RFC 5261
                # section 4.2.3); otherwise lxml reuses the target's prefix for the URI.
                element = _redeclare(state, element, {**_own_namespaces(element), prefix: uri})
        element.set(f"{{{uri}}}{local}" if uri else local, self.value)

    def _add_namespace(self, state: _State, element: etree._Element) -> None:
        prefix, uri = self.namespace, self.value
        assert prefix is not None
        if prefix in _own_namespaces(element):
            raise PatchError(
                INVALID_NAMESPACE_PREFIX, f"prefix {prefix!r} is already declared on the element"
            )
        inherited = element.nsmap.get(prefix)
        if inherited is not None and inherited != uri:
            user = _prefix_users(element, prefix, inherited)
            if user is not None:
                raise PatchError(
                    INVALID_NAMESPACE_PREFIX,
                    f"prefix {prefix!r} is bound to {inherited!r} in scope and used by {user}; "
                    "redeclaring it would change that name",
                )
        _redeclare(state, element, {**_own_namespaces(element), prefix: uri})

    def _add_nodes(self, state: _State, target: _Target) -> None:
        pos = self.pos
        node = target.node
        if target.kind in ("attribute", "namespace"):
            raise PatchError(
                INVALID_NODE_TYPES, f"nodes cannot be added to {_KIND_NAMES[target.kind]}"
            )
        if pos not in ("before", "after") and target.kind != "element":
            raise PatchError(
                INVALID_NODE_TYPES,
                f"children can only be added to an element, sel located {_KIND_NAMES[target.kind]}",
            )
        if target.kind == "text":
            parent = node if target.name == "text" else node.getparent()
            index = 0 if target.name == "text" else parent.index(node) + 1
            slot = (node, target.name == "tail")
            text = _get_slot(*slot)
            before, after = ("", text) if pos == "before" else (text, "")
        elif pos in ("before", "after") and node.getparent() is None:
            self._add_top_level(node, pos)
            return
        elif pos == "before":
            parent = node.getparent()
            index = parent.index(node)
            previous = _previous_slot(node)
            assert previous is not None
            slot, before, after = previous, _get_slot(*previous), ""
        elif pos == "after":
            parent = node.getparent()
            index = parent.index(node) + 1
            slot, before, after = (node, True), "", node.tail or ""
        elif pos == "prepend":
            parent, index = node, 0
            slot, before, after = (node, False), "", node.text or ""
        else:  # append, the default (RFC 5261 section 4.3)
            parent, index = node, len(node)
            slot = (node[-1], True) if index else (node, False)
            before, after = _get_slot(*slot), ""
        inserted = _splice(parent, index, slot, before, after, self.items)
        if inserted and parent.nsmap.get(None):
            _fix_unqualified(state, inserted)

    def _add_top_level(self, node: etree._Element, pos: str) -> None:
        # Only comments and processing instructions can be siblings of the root element.
        nodes: list[etree._Element] = []
        for item in self.items:
            if isinstance(item, str):
                if _is_whitespace(item):
                    continue  # whitespace outside the root element is not in the data model
                raise PatchError(
                    INVALID_XML_PROLOG_OPERATION,
                    "text cannot be added outside the root element",
                )
            if _node_kind(item) == "element":
                raise PatchError(
                    INVALID_ROOT_ELEMENT_OPERATION,
                    "an element cannot be added as a sibling of the root element",
                )
            if _node_kind(item) == "entity":
                raise PatchError(
                    INVALID_XML_PROLOG_OPERATION,
                    "an entity reference cannot be added outside the root element",
                )
            nodes.append(item)
        anchor = node
        for item in nodes:
            new = copy.deepcopy(item)
            if pos == "before":
                node.addprevious(new)
            else:
                anchor.addnext(new)
                anchor = new


def _splice(
    parent: etree._Element,
    index: int,
    slot: tuple[etree._Element, bool],
    before: str,
    after: str,
    items: tuple[_Item, ...],
) -> list[etree._Element]:
    """Put `items` between the texts `before` and `after` at child position `index` of parent.

    `slot` holds the text preceding that position. Text items merge with the neighbouring text
    (the XPath data model has no adjacent text nodes); nodes are inserted as fresh copies.
    """
    leading: list[str] = []
    position = 0
    while position < len(items) and isinstance(items[position], str):
        leading.append(items[position])  # type: ignore[arg-type]
        position += 1
    if position == len(items):
        _set_slot(slot[0], slot[1], before + "".join(leading) + after)
        return []
    _set_slot(slot[0], slot[1], before + "".join(leading))
    inserted: list[etree._Element] = []
    last: etree._Element | None = None
    for item in items[position:]:
        if isinstance(item, str):
            assert last is not None
            last.tail = (last.tail or "") + item
        else:
            last = copy.deepcopy(item)
            parent.insert(index, last)
            index += 1
            inserted.append(last)
    assert last is not None
    last.tail = ((last.tail or "") + after) or None
    return inserted


class _Replace(_Operation):
    __slots__ = ("items",)

    def __init__(self, selector: _Selector, items: tuple[_Item, ...]) -> None:
        super().__init__("replace", selector)
        self.items = items

    def apply(self, state: _State) -> None:
        target = _locate_in(self.selector, state)
        replacement = _replacement(self.items, target.kind)
        node = target.node
        if isinstance(replacement, str):
            if target.kind == "attribute":
                node.set(target.name, replacement)
            elif target.kind == "text":
                _set_slot(node, target.name == "tail", replacement)
            else:
                self._replace_namespace(state, node, target.name, replacement)
            return
        new = copy.deepcopy(replacement)
        parent = node.getparent()
        if parent is None:
            if target.kind == "element":
                _swap_root(state, new)  # RFC 5261 section 5 does not forbid replacing the root
            else:
                node.addnext(new)
                _discard_top_level(node)
            return
        new.tail = node.tail
        parent.replace(node, new)
        if target.kind == "element" and parent.nsmap.get(None):
            _fix_unqualified(state, [new])

    def _replace_namespace(
        self, state: _State, element: etree._Element, prefix: str, uri: str
    ) -> None:
        declarations = _own_namespaces(element)
        old = declarations[prefix]
        if old == uri:
            return
        # RFC 5261 section 4.4.3 with errata 3478: the names bound through this declaration
        # move to the new namespace URI.
        rename = _Rename(element, prefix, old, uri)
        _rebuild(state, {element: {**declarations, prefix: uri}}, rename)


_WS_VALUES: Final = frozenset({"before", "after", "both"})


class _Remove(_Operation):
    __slots__ = ("ws",)

    def __init__(self, selector: _Selector, ws: str | None) -> None:
        super().__init__("remove", selector)
        self.ws = ws

    def apply(self, state: _State) -> None:
        target = _locate_in(self.selector, state)
        kind, node = target.kind, target.node
        if self.ws is not None and kind in ("attribute", "text", "namespace"):
            raise _ws_not_applicable(self.ws, kind)
        if kind == "attribute":
            del node.attrib[target.name]
        elif kind == "text":
            _set_slot(node, target.name == "tail", None)
        elif kind == "namespace":
            self._remove_namespace(state, node, target.name)
        elif _is_root(node):
            raise PatchError(INVALID_ROOT_ELEMENT_OPERATION, "the root element cannot be removed")
        else:
            if self.ws is not None:
                self._remove_whitespace(node)
            _detach(node)

    def _remove_whitespace(self, node: etree._Element) -> None:
        ws = self.ws
        previous = _previous_slot(node)
        if previous is None or node.getparent() is None:
            raise PatchError(
                INVALID_WHITESPACE_DIRECTIVE,
                "whitespace outside the root element is not part of the document",
            )
        # RFC 5261 section 4.5: the whitespace text node immediately before and/or after the
        # removed node goes too; it must exist (section 5, invalid-whitespace-directive).
        if ws in ("before", "both") and not _is_whitespace(_get_slot(*previous)):
            raise PatchError(
                INVALID_WHITESPACE_DIRECTIVE,
                f"ws={ws!r}: no whitespace-only text node precedes the removed node",
            )
        if ws in ("after", "both") and not _is_whitespace(node.tail):
            raise PatchError(
                INVALID_WHITESPACE_DIRECTIVE,
                f"ws={ws!r}: no whitespace-only text node follows the removed node",
            )
        if ws in ("before", "both"):
            _set_slot(previous[0], previous[1], None)
        if ws in ("after", "both"):
            node.tail = None

    def _remove_namespace(self, state: _State, element: etree._Element, prefix: str) -> None:
        declarations = _own_namespaces(element)
        user = _prefix_users(element, prefix, declarations[prefix])
        if user is not None:
            # RFC 5261 section 4.5: the prefix must not be in use when its namespace node is
            # removed; the directive cannot be fulfilled.
            raise PatchError(
                INVALID_PATCH_DIRECTIVE,
                f"namespace prefix {prefix!r} is still used by {user}",
            )
        del declarations[prefix]
        _redeclare(state, element, declarations)


def _ws_not_applicable(ws: str, kind: str) -> PatchError:
    return PatchError(
        INVALID_WHITESPACE_DIRECTIVE,
        f"ws={ws!r} does not apply to {_KIND_NAMES[kind]}: it never has an adjacent "
        "whitespace text node",
    )


# ---------------------------------------------------------------------------------------------
# Compiling operation elements

_ALLOWED_ATTRIBUTES: Final = {
    "add": frozenset({"sel", "pos", "type"}),
    "replace": frozenset({"sel"}),
    "remove": frozenset({"sel", "ws"}),
}
_TYPE_ATTRIBUTE_RE: Final = re.compile(rf"@({NCNAME}(?::{NCNAME})?)\Z")
_TYPE_NAMESPACE_RE: Final = re.compile(rf"namespace::({NCNAME})\Z")


_PREFIX_BEFORE_COLON: Final = re.compile(rf"({NCNAME}):")


def _bindings(element: etree._Element, namespaces: dict[str, str]) -> _Bindings:
    """The namespaces in scope of an operation element (`namespaces`, "" for the default one)
    that its `sel` and `type` can name: the default namespace and each prefix written before a
    colon in them (every QName's prefix is; a few more words may be, which only adds an unused
    binding)."""
    if not namespaces:
        return ()
    named = _PREFIX_BEFORE_COLON.findall(f"{element.get('sel', '')} {element.get('type', '')}")
    wanted = {"", *named}
    return tuple(sorted((prefix, uri) for prefix, uri in namespaces.items() if prefix in wanted))


def in_scope(element: etree._Element, inherited: dict[str, str]) -> dict[str, str]:
    """The namespaces in scope of `element` ("" for the default one; an empty URI undeclares
    it), given those of its parent: reading `nsmap` per operation would build the whole map,
    every URI decoded, once per operation."""
    own = _own_namespaces(element)
    if not own:
        return inherited
    merged = {**inherited, **own}
    if merged.get("") == "":
        del merged[""]
    return merged


def in_scope_of(element: etree._Element) -> dict[str, str]:
    """All the namespaces in scope of `element`, "" for the default one."""
    return {prefix or "": uri for prefix, uri in element.nsmap.items()}


# Compiled operations by what they are compiled from, for operation elements without child
# nodes (most of a feed: attribute and text values). Feeds repeat operations (the same price,
# the same status) across messages, and a hit costs a lookup instead of a compile.
_OperationKey: TypeAlias = (
    "tuple[str, tuple[tuple[str, str], ...], str | None, _Bindings, tuple[int, int]]"
)
_OPERATIONS: Final[OrderedDict[_OperationKey, _Operation]] = OrderedDict()
_OPERATIONS_MAXSIZE: Final = 4096


def _compiled_operation(
    element: etree._Element, limits: SelectorLimits, namespaces: dict[str, str]
) -> _Operation:
    bindings = _bindings(element, namespaces)
    if len(element):
        return _compile_operation(element, limits, bindings)
    # Everything _compile_operation reads of a childless element: its name, its attributes,
    # its text and the namespaces in scope on it, and the only bounds a compile reads (two
    # ints hash faster than the whole limits record). (Failures are not kept: they are rare and
    # raise with the element's own detail.)
    key: _OperationKey = (
        element.tag,
        tuple(element.attrib.items()),
        element.text,
        bindings,
        (limits.max_selector_length, limits.max_selector_steps),
    )
    if _operation_key_chars(key) > CACHED_KEY_CHARS:
        return _compile_operation(element, limits, bindings)
    operation = _OPERATIONS.get(key)
    if operation is None:
        operation = _compile_operation(element, limits, bindings)
        _OPERATIONS[key] = operation
        if len(_OPERATIONS) > _OPERATIONS_MAXSIZE:
            _OPERATIONS.popitem(last=False)
    else:
        try:
            _OPERATIONS.move_to_end(key)
        except KeyError:  # evicted meanwhile by another thread: it stays compiled here
            pass
    return operation


def _operation_key_chars(key: _OperationKey) -> int:
    tag, attributes, text, bindings, _ = key
    pairs = (*attributes, *bindings)
    return _key_chars(tag, text, *(part for pair in pairs for part in pair))


def _compile_operation(
    element: etree._Element, limits: SelectorLimits, bindings: _Bindings
) -> _Operation:
    tag = element.tag
    # (A QName is only needed to take the namespace off; most patches have none.)
    name = etree.QName(element).localname if tag[0] == "{" else tag
    allowed = _ALLOWED_ATTRIBUTES.get(name)
    if allowed is None:
        raise PatchError(
            INVALID_PATCH_DIRECTIVE, f"<{name}> is not an RFC 5261 operation (add, replace, remove)"
        )
    for key in element.attrib:
        if not key.startswith("{") and key not in allowed:
            why = " (a multi-node extension, not RFC 5261)" if key == "msel" else ""
            raise PatchError(INVALID_PATCH_DIRECTIVE, f"<{name}> has no attribute {key!r}{why}")
    sel = element.get("sel")
    if sel is None or not sel.strip(_XML_SPACE):
        raise PatchError(INVALID_ATTRIBUTE_VALUE, f"<{name}> needs a non-empty sel attribute")
    selector = _selector(sel, bindings, limits)
    items = _content(element)
    if name == "add":
        return _compile_add(element, selector, items, dict(bindings))
    if name == "replace":
        # The content is checked against the node the selector locates (RFC 5261 4.4), so a
        # selector that locates nothing is reported as such first.
        return _Replace(selector, items)
    return _compile_remove(element, selector, items)


def _compile_add(
    element: etree._Element,
    selector: _Selector,
    items: tuple[_Item, ...],
    in_scope: dict[str, str],
) -> _Add:
    pos = element.get("pos")
    if pos is not None and pos not in _POSITIONS:
        raise PatchError(INVALID_ATTRIBUTE_VALUE, f"pos={pos!r}: expected before, after or prepend")
    type_ = element.get("type")
    if type_ is None:
        return _Add(selector, pos, None, None, items, "")
    if pos is not None:
        raise PatchError(
            INVALID_PATCH_DIRECTIVE, "pos has no meaning when adding an attribute or a namespace"
        )
    attribute_match = _TYPE_ATTRIBUTE_RE.match(type_)
    namespace_match = _TYPE_NAMESPACE_RE.match(type_)
    if attribute_match is not None:
        # RFC 5261 section 4.3: the new value is the single text node child.
        value = _text_only(items, f"type={type_!r}")
        qname = attribute_match.group(1)
        prefix, _, local = qname.rpartition(":")
        if qname == "xmlns" or prefix == "xmlns":
            raise PatchError(
                INVALID_ATTRIBUTE_VALUE,
                f"type={type_!r}: namespace declarations are added with type='namespace::prefix'",
            )
        uri = ""
        if prefix == "xml":
            uri = XML_NAMESPACE
        elif prefix:
            # Attribute prefixes resolve in the patch document (section 4.2.3); unprefixed
            # attributes are in no namespace whatever the default namespace is.
            found = in_scope.get(prefix)
            if not found:
                raise PatchError(
                    INVALID_NAMESPACE_PREFIX,
                    f"type={type_!r}: prefix {prefix!r} is not declared in the patch document",
                )
            uri = found
        return _Add(selector, None, (uri, local, prefix), None, items, value)
    if namespace_match is not None:
        value = _text_only(items, f"type={type_!r}")
        prefix = namespace_match.group(1)
        if prefix in ("xml", "xmlns"):
            raise PatchError(
                INVALID_NAMESPACE_PREFIX, f"type={type_!r}: prefix {prefix!r} cannot be declared"
            )
        _check_namespace_uri(value)
        return _Add(selector, None, None, prefix, items, value)
    raise PatchError(
        INVALID_ATTRIBUTE_VALUE, f"type={type_!r}: expected '@name' or 'namespace::prefix'"
    )


def _compile_remove(
    element: etree._Element, selector: _Selector, items: tuple[_Item, ...]
) -> _Remove:
    ws = element.get("ws")
    if ws is not None and ws not in _WS_VALUES:
        raise PatchError(INVALID_ATTRIBUTE_VALUE, f"ws={ws!r}: expected before, after or both")
    for item in items:
        if isinstance(item, str):
            if item.strip(_XML_SPACE):
                raise PatchError(INVALID_PATCH_DIRECTIVE, "<remove> takes no content")
        elif _node_kind(item) == "element":
            raise PatchError(INVALID_PATCH_DIRECTIVE, "<remove> takes no content")
    return _Remove(selector, ws)


# A `sel` is quoted in an error's detail up to this many characters: a dead letter's detail
# names the selector without carrying a selector that was refused for its length.
_SEL_QUOTED_MAX: Final = 200


def _sel_for_detail(sel: str | None) -> str:
    if sel is None:
        return ">"
    if len(sel) > _SEL_QUOTED_MAX:
        return f" sel={sel[:_SEL_QUOTED_MAX]!r}...>"
    return f" sel={sel!r}>"


@lru_cache(maxsize=64)
def _normalised_encoding(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name).name
    except LookupError:
        return name.lower()


def _attributes_only(operations: tuple[_Operation, ...]) -> bool:
    """Whether every operation replaces or removes an attribute through a plain selector, and
    none of those attributes is one the selectors' predicates read.

    Such a patch changes no element and no attribute any selector depends on, so each plain
    selector's element steps select the same elements throughout an application.
    """
    changed: set[str] = set()
    keys: set[str] = set()
    for operation in operations:
        plain = operation.selector.plain
        if plain is None or not isinstance(operation, _Replace | _Remove):
            return False
        changed.add(plain.attribute)
        keys |= plain.keys
    return bool(operations) and changed.isdisjoint(keys)


class Patch:
    """A compiled patch: the operation elements (the element children of a <diff> element, or of
    a <sportsdata category="update"> element: the engine does not care what the parent is
    called). Immutable once compiled, so one Patch applies to any number of documents."""

    __slots__ = ("_operations", "_encoding", "_attributes_only")

    def __init__(self, operations: tuple[_Operation, ...], encoding: str | None) -> None:
        self._operations = operations
        self._encoding = encoding
        self._attributes_only = _attributes_only(operations)

    @classmethod
    def from_element(
        cls, operations_parent: etree._Element, limits: SelectorLimits = DEFAULT_SELECTOR_BOUNDS
    ) -> Patch:
        """Compile the operation elements under `operations_parent`; raises PatchError.

        Comments and processing instructions between operations are ignored; text that is not
        whitespace is `invalid-diff-format`, an element other than add/replace/remove or an
        attribute RFC 5261 does not define for it is `invalid-patch-directive`, and an invalid
        attribute value (a `sel` outside the RFC 5261 selector grammar among them) is
        `invalid-attribute-value`, and a `sel` over a bound of `limits` is `too-complex`.
        Whatever depends only on the operation (attributes, selector syntax, bounds and
        prefixes, <add type> content) is checked here; what depends on the located node is
        checked when applying.
        """
        if not isinstance(operations_parent, etree._Element) or not isinstance(
            operations_parent.tag, str
        ):
            raise PatchError(INVALID_DIFF_FORMAT, "the patch operations need a parent element")
        if operations_parent.text and operations_parent.text.strip(_XML_SPACE):
            raise PatchError(INVALID_DIFF_FORMAT, "text is not allowed between operations")
        operations: list[_Operation] = []
        inherited = in_scope_of(operations_parent)
        for child in operations_parent:
            if child.tail and child.tail.strip(_XML_SPACE):
                raise PatchError(INVALID_DIFF_FORMAT, "text is not allowed between operations")
            if isinstance(child, etree._Entity):
                raise PatchError(
                    INVALID_ENTITY_DECLARATION, f"entity reference {child.text} is not expanded"
                )
            if not isinstance(child.tag, str):
                continue  # comments and processing instructions
            index = len(operations) + 1
            try:
                namespaces = in_scope(child, inherited)
                operations.append(_compiled_operation(child, limits, namespaces))
            except PatchError as error:
                where = f"operation {index} <{etree.QName(child).localname}"
                where += _sel_for_detail(child.get("sel"))
                raise PatchError(error.error, f"{where}: {error.detail}") from None
        encoding = _normalised_encoding(operations_parent.getroottree().docinfo.encoding)
        return cls(tuple(operations), encoding)

    def __len__(self) -> int:
        return len(self._operations)

    def __repr__(self) -> str:
        return f"<Patch of {len(self._operations)} operation(s)>"

    def apply(self, document: etree._ElementTree) -> etree._ElementTree:
        """Apply the operations in document order to a copy of `document` and return the copy.

        The input is never modified. Atomic: the first failing operation raises PatchError and
        no result is returned.
        """
        self._check_document(document)
        return self._apply(copy.deepcopy(document))

    def apply_in_place(
        self,
        document: etree._ElementTree,
        located: dict[str, list[etree._Element]] | None = None,
    ) -> etree._ElementTree:
        """Apply the operations in document order to `document` itself and return the result.

        The result is `document`, or a new tree when an operation replaced the root element
        (or rebuilt the document for a namespace operation); it is what `apply` would return.
        Not atomic: after a PatchError `document` may be partly patched and must be discarded.
        For a caller that owns its tree and rarely sees a failure (the fold), this saves the
        copy `apply` makes of the whole document for every update.

        When the patch only replaces or removes attributes its selectors do not read, the
        elements its selectors' element steps select are the same in the input and in the
        result; `located`, if given, is then filled with them, keyed by the XPath of those
        steps (the selector without its final `/@name`), so the caller need not select again.
        """
        self._check_document(document)
        root = document.getroot()
        if root is None or root.getparent() is not None:
            # Not a whole document (a tree over an element inside another one): patching it
            # in place would not give what `apply` gives for its copy.
            return self._apply(copy.deepcopy(document))
        return self._apply(document, located)

    def _check_document(self, document: etree._ElementTree) -> None:
        if not isinstance(document, etree._ElementTree):
            raise TypeError(f"expected an lxml ElementTree, got {type(document).__name__}")
        if self._encoding is not None:
            encoding = _normalised_encoding(document.docinfo.encoding)
            if encoding is not None and encoding != self._encoding:
                raise PatchError(
                    INVALID_CHARACTER_SET,
                    f"the document is {document.docinfo.encoding} but the patch is "
                    f"{self._encoding}",
                )

    def _apply(
        self,
        tree: etree._ElementTree,
        located: dict[str, list[etree._Element]] | None = None,
    ) -> etree._ElementTree:
        elements = None
        if self._attributes_only:
            elements = {} if located is None else located
        state = _State(tree, elements)
        for index, operation in enumerate(self._operations, 1):
            try:
                operation.apply(state)
            except PatchError as error:
                raise PatchError(error.error, f"{operation.where(index)}: {error.detail}") from None
        return state.tree


def apply_patch(
    document: etree._ElementTree, operations_parent: etree._Element
) -> etree._ElementTree:
    """Convenience: Patch.from_element(operations_parent).apply(document)."""
    return Patch.from_element(operations_parent).apply(document)
