//! Finding the manifest data island in plugin HTML with the HTML tokenizer
//! alone: one pass over the input, no document tree, time linear in the
//! input. Memory: the island (at most `MANIFEST_MAX_BYTES`), one chunk of
//! input, open elements to a fixed depth, and what the tokenizer holds of
//! one token (a comment or an attribute value, at most the input).
//!
//! Which `<script>` counts is unchanged from the tree-building reader: any
//! `script` element whose `type`, trimmed, is `MANIFEST_SCRIPT_TYPE` in any
//! ASCII case; its text is the island. The tokenizer needs to be told what a
//! tree builder would tell it (that `<script>` content is script data, that
//! `<style>` content is raw text, when CDATA sections are allowed), and for
//! that the open elements are followed: foreign content (`<svg>`, `<math>`)
//! and its integration points, HTML elements as far as end tags and the
//! start tags that close a `p` tell. Not followed: the insertion modes that
//! drop a start tag (`<frameset>` pages, `<svg>` inside `<select>`), tables
//! (foster parenting), the reopening of formatting elements, and nesting
//! deeper than `TRACKED_NESTING_DEPTH`. Only pages that nest foreign content
//! and HTML with stray end tags are read differently; the browser reading
//! the same page is the one that runs it.

use super::{ManifestError, MANIFEST_MAX_BYTES, MANIFEST_SCRIPT_TYPE};
use html5ever::tendril::StrTendril;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{
    BufferQueue, Tag, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts,
};
use html5ever::{local_name, LocalName};

/// An end tag is matched against at most this many open elements, nearest
/// first: tree construction searches the whole stack of open elements,
/// which is what made deep nesting quadratic. Pages that close an element
/// from more than this many levels inside it are not read as a browser
/// would; a plugin page is nowhere near that deep.
const END_TAG_SEARCH_DEPTH: usize = 64;

/// Open elements are tracked this deep, in HTML and in foreign content
/// (as browsers stop nesting deeper, at 512 in some): deeper ones are
/// counted, not kept, so that a lookup's memory does not grow with the
/// nesting of hostile input.
const TRACKED_NESTING_DEPTH: usize = 512;

/// The input is handed to the tokenizer this many bytes at a time, so a
/// lookup holds one chunk of copied input, not a copy of all of it.
const TOKENIZER_CHUNK_BYTES: usize = 64 * 1024;

/// The manifest data island of a plugin page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataIsland {
    /// The script element's text (line ends normalised to `\n`, as the
    /// HTML parser does).
    pub text: String,
    /// The line of the HTML file on which the text starts (1-based): the
    /// line of the `>` that ends the `<script …>` start tag.
    pub line: u64,
}

/// Finds the one manifest data island in `html`.
pub fn find_data_island(html: &str) -> Result<DataIsland, ManifestError> {
    let mut tokenizer = Tokenizer::new(IslandSink::default(), TokenizerOpts::default());
    let mut queue = BufferQueue::default();
    let mut rest = html;
    while !rest.is_empty() {
        let mut cut = rest.len().min(TOKENIZER_CHUNK_BYTES);
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let (chunk, tail) = rest.split_at(cut);
        rest = tail;
        queue.push_back(StrTendril::from_slice(chunk));
        // The sink never asks the tokenizer to pause, so each feed takes all
        // of the queue except what it must keep to look ahead.
        let _ = tokenizer.feed(&mut queue);
    }
    tokenizer.end();
    let sink = tokenizer.sink;
    match sink.islands {
        0 => Err(ManifestError::NoDataIsland),
        1 if sink.too_large => Err(ManifestError::InvalidJson {
            message: format!(
                "the data island is larger than {MANIFEST_MAX_BYTES} bytes, the limit for a manifest"
            ),
        }),
        1 if sink.text.trim().is_empty() => Err(ManifestError::EmptyDataIsland),
        1 => Ok(DataIsland {
            text: sink.text,
            line: sink.line,
        }),
        count => Err(ManifestError::SeveralDataIslands { count }),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ns {
    Svg,
    MathMl,
}

/// An open element of foreign content (SVG or MathML), with the HTML
/// elements opened inside it when it is an integration point.
#[derive(Debug)]
struct Foreign {
    name: LocalName,
    ns: Ns,
    /// HTML elements open inside this one, outermost first. While any is
    /// open, the current node is an HTML element.
    html: OpenElements,
}

impl Foreign {
    /// An HTML integration point: start tags inside follow the HTML rules.
    fn html_integration_point(&self) -> bool {
        // Tag names arrive lower-cased (`foreignobject`).
        self.ns == Ns::Svg && matches!(&*self.name, "foreignobject" | "desc" | "title")
    }

    /// A MathML text integration point: start tags other than `mglyph`
    /// and `malignmark` follow the HTML rules.
    fn mathml_text_integration_point(&self) -> bool {
        self.ns == Ns::MathMl && matches!(&*self.name, "mi" | "mo" | "mn" | "ms" | "mtext")
    }

    fn integration_point(&self) -> bool {
        self.html_integration_point() || self.mathml_text_integration_point()
    }
}

#[derive(Default)]
struct IslandSink {
    /// Manifest `<script>` elements seen.
    islands: usize,
    /// The first island's text so far, at most `MANIFEST_MAX_BYTES`.
    text: String,
    too_large: bool,
    line: u64,
    /// Collecting the first island's text.
    collecting: bool,
    /// For an island in foreign content: it ends when the stack of open
    /// foreign elements is cut to this length or less.
    island_depth: Option<usize>,
    /// Open SVG and MathML elements, outermost first.
    foreign: Vec<Foreign>,
    /// Foreign elements open beyond `TRACKED_NESTING_DEPTH`.
    foreign_untracked: usize,
    /// A newline right after `<textarea>`, `<pre>` or `<listing>` is not
    /// part of the text.
    skip_newline: bool,
    /// HTML elements open outside foreign content, outermost first (as far
    /// as end tags tell; implied ends are not followed).
    html: OpenElements,
}

/// Open HTML elements, outermost first, each with what an end tag's
/// search needs to know of it, and how many are `p`.
#[derive(Debug, Default)]
struct OpenElements {
    open: Vec<(LocalName, u8)>,
    paragraphs: usize,
}

/// In the "special" category: the search of an end tag for a name outside
/// it stops here.
const SPECIAL: u8 = 1;
/// A scope boundary: the search of an end tag for a special name stops here.
const SCOPE_BOUNDARY: u8 = 2;
/// `button`: ends the search for a `p` to close.
const BUTTON: u8 = 4;

impl OpenElements {
    fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    fn push(&mut self, name: LocalName) {
        if self.open.len() >= TRACKED_NESTING_DEPTH {
            return;
        }
        let mut class = 0;
        if is_special(&name) {
            class |= SPECIAL;
        }
        if is_scope_boundary(&name) {
            class |= SCOPE_BOUNDARY;
        }
        if name == local_name!("button") {
            class |= BUTTON;
        }
        if name == local_name!("p") {
            self.paragraphs += 1;
        }
        self.open.push((name, class));
    }

    fn truncate(&mut self, len: usize) {
        let closed_p = self.open[len.min(self.open.len())..]
            .iter()
            .filter(|(n, _)| *n == local_name!("p"))
            .count();
        self.paragraphs -= closed_p;
        self.open.truncate(len);
    }

    /// Closes the nearest open element named `name` (and those inside
    /// it), as an end tag in the body does: an end tag for one of the
    /// "special" elements looks through to the nearest scope boundary (a
    /// table cell, a template, …), any other one stops at the nearest
    /// special element. Only `END_TAG_SEARCH_DEPTH` elements are looked at.
    /// Returns whether one was closed.
    fn close(&mut self, name: &LocalName) -> bool {
        let stop = if is_special(name) {
            SCOPE_BOUNDARY
        } else {
            SPECIAL
        };
        let nearest = self.open.len().saturating_sub(END_TAG_SEARCH_DEPTH);
        for i in (nearest..self.open.len()).rev() {
            let (open, class) = &self.open[i];
            if open == name {
                self.truncate(i);
                return true;
            }
            if class & stop != 0 {
                return false;
            }
        }
        false
    }

    /// Closes the nearest open `p` unless a scope boundary or a `button`
    /// comes first.
    fn close_p(&mut self) {
        if self.paragraphs == 0 {
            return;
        }
        let nearest = self.open.len().saturating_sub(END_TAG_SEARCH_DEPTH);
        for i in (nearest..self.open.len()).rev() {
            let (open, class) = &self.open[i];
            if *open == local_name!("p") {
                self.truncate(i);
                return;
            }
            if class & (SCOPE_BOUNDARY | BUTTON) != 0 {
                return;
            }
        }
    }
}

/// Start tags that first close an open `p` (in button scope).
fn closes_p(name: &LocalName) -> bool {
    matches!(
        &**name,
        "address"
            | "article"
            | "aside"
            | "blockquote"
            | "center"
            | "details"
            | "dialog"
            | "dir"
            | "div"
            | "dl"
            | "fieldset"
            | "figcaption"
            | "figure"
            | "footer"
            | "header"
            | "hgroup"
            | "main"
            | "menu"
            | "nav"
            | "ol"
            | "p"
            | "search"
            | "section"
            | "summary"
            | "ul"
            | "h1"
            | "h2"
            | "h3"
            | "h4"
            | "h5"
            | "h6"
            | "pre"
            | "listing"
            | "form"
            | "plaintext"
            | "hr"
            | "xmp"
    )
}

/// Elements whose end tag ignores the elements inside them.
fn is_scope_boundary(name: &str) -> bool {
    matches!(
        name,
        "applet" | "caption" | "html" | "table" | "td" | "th" | "marquee" | "object" | "template"
    )
}

/// The HTML parser's "special" category.
fn is_special(name: &str) -> bool {
    matches!(
        name,
        "address"
            | "applet"
            | "area"
            | "article"
            | "aside"
            | "base"
            | "basefont"
            | "bgsound"
            | "blockquote"
            | "body"
            | "br"
            | "button"
            | "caption"
            | "center"
            | "col"
            | "colgroup"
            | "dd"
            | "details"
            | "dir"
            | "div"
            | "dl"
            | "dt"
            | "embed"
            | "fieldset"
            | "figcaption"
            | "figure"
            | "footer"
            | "form"
            | "frame"
            | "frameset"
            | "h1"
            | "h2"
            | "h3"
            | "h4"
            | "h5"
            | "h6"
            | "head"
            | "header"
            | "hgroup"
            | "hr"
            | "html"
            | "iframe"
            | "img"
            | "input"
            | "keygen"
            | "li"
            | "link"
            | "listing"
            | "main"
            | "marquee"
            | "menu"
            | "meta"
            | "nav"
            | "noembed"
            | "noframes"
            | "noscript"
            | "object"
            | "ol"
            | "p"
            | "param"
            | "plaintext"
            | "pre"
            | "script"
            | "search"
            | "section"
            | "select"
            | "source"
            | "style"
            | "summary"
            | "table"
            | "tbody"
            | "td"
            | "template"
            | "textarea"
            | "tfoot"
            | "th"
            | "thead"
            | "title"
            | "tr"
            | "track"
            | "ul"
            | "wbr"
            | "xmp"
    )
}

fn is_manifest_script(tag: &Tag) -> bool {
    tag.name == local_name!("script")
        && tag.attrs.iter().any(|a| {
            a.name.local == local_name!("type")
                && a.value.trim().eq_ignore_ascii_case(MANIFEST_SCRIPT_TYPE)
        })
}

/// Start tags that end foreign content (`<font>` too, with `color`, `face`
/// or `size`).
fn breaks_out_of_foreign_content(tag: &Tag) -> bool {
    match &*tag.name {
        "b" | "big" | "blockquote" | "body" | "br" | "center" | "code" | "dd" | "div" | "dl"
        | "dt" | "em" | "embed" | "h1" | "h2" | "h3" | "h4" | "h5" | "h6" | "head" | "hr" | "i"
        | "img" | "li" | "listing" | "menu" | "meta" | "nobr" | "ol" | "p" | "pre" | "ruby"
        | "s" | "small" | "span" | "strong" | "strike" | "sub" | "sup" | "table" | "tt" | "u"
        | "ul" | "var" => true,
        "font" => tag
            .attrs
            .iter()
            .any(|a| matches!(&*a.name.local, "color" | "face" | "size")),
        _ => false,
    }
}

/// HTML elements that are never open (they have no end tag).
fn is_void(name: &LocalName) -> bool {
    matches!(
        &**name,
        "area"
            | "base"
            | "basefont"
            | "bgsound"
            | "br"
            | "col"
            | "embed"
            | "frame"
            | "hr"
            | "image"
            | "img"
            | "input"
            | "keygen"
            | "link"
            | "meta"
            | "param"
            | "source"
            | "track"
            | "wbr"
    )
}

impl IslandSink {
    /// Whether the current node is an SVG or MathML element.
    fn in_foreign_node(&self) -> bool {
        self.foreign.last().is_some_and(|f| f.html.is_empty())
    }

    /// Whether a start tag is handled by the rules for foreign content.
    fn start_tag_is_foreign(&self, tag: &Tag) -> bool {
        let Some(top) = self.foreign.last().filter(|f| f.html.is_empty()) else {
            return false;
        };
        if top.html_integration_point() {
            return false;
        }
        if top.mathml_text_integration_point() && !matches!(&*tag.name, "mglyph" | "malignmark") {
            return false;
        }
        if top.ns == Ns::MathMl && &*top.name == "annotation-xml" && tag.name == local_name!("svg")
        {
            return false;
        }
        true
    }

    fn push_foreign(&mut self, name: LocalName, ns: Ns) {
        if self.foreign.len() < TRACKED_NESTING_DEPTH {
            self.foreign.push(Foreign {
                name,
                ns,
                html: OpenElements::default(),
            });
        } else {
            self.foreign_untracked += 1;
        }
    }

    fn truncate_foreign(&mut self, len: usize) {
        self.foreign_untracked = 0;
        self.foreign.truncate(len);
        if self.island_depth.is_some_and(|d| len <= d) {
            self.island_depth = None;
            self.collecting = false;
        }
    }

    /// Closes foreign elements until the current node is HTML or an
    /// integration point.
    fn break_out(&mut self) {
        self.foreign_untracked = 0;
        while self
            .foreign
            .last()
            .is_some_and(|f| f.html.is_empty() && !f.integration_point())
        {
            self.truncate_foreign(self.foreign.len() - 1);
        }
    }

    fn start_island(&mut self, line: u64, depth: Option<usize>) {
        self.islands += 1;
        if self.islands == 1 {
            self.collecting = true;
            self.line = line;
            self.island_depth = depth;
        }
    }

    fn start_tag(&mut self, tag: Tag, line: u64) -> TokenSinkResult<()> {
        if !self.start_tag_is_foreign(&tag) {
            return self.html_start_tag(tag, line);
        }
        if breaks_out_of_foreign_content(&tag) {
            self.break_out();
            return self.html_start_tag(tag, line);
        }
        let ns = self.foreign.last().map_or(Ns::Svg, |f| f.ns);
        if is_manifest_script(&tag) {
            // An SVG or MathML `script`: its text is all the text inside.
            self.start_island(line, Some(self.foreign.len()));
        }
        if tag.self_closing {
            if self.island_depth == Some(self.foreign.len()) {
                self.island_depth = None;
                self.collecting = false;
            }
        } else {
            self.push_foreign(tag.name, ns);
        }
        TokenSinkResult::Continue
    }

    /// A start tag by the HTML rules. A self-closing flag is ignored on
    /// HTML elements.
    fn html_start_tag(&mut self, tag: Tag, line: u64) -> TokenSinkResult<()> {
        if closes_p(&tag.name) {
            let open = match self.foreign.last_mut() {
                Some(top) => &mut top.html,
                None => &mut self.html,
            };
            open.close_p();
        }
        self.skip_newline = matches!(&*tag.name, "textarea" | "pre" | "listing");
        let result = match tag.name {
            local_name!("script") => {
                if is_manifest_script(&tag) {
                    self.start_island(line, None);
                }
                TokenSinkResult::RawData(RawKind::ScriptData)
            }
            local_name!("style")
            | local_name!("xmp")
            | local_name!("iframe")
            | local_name!("noembed")
            | local_name!("noframes")
            // Scripting is on, as in a browser.
            | local_name!("noscript") => TokenSinkResult::RawData(RawKind::Rawtext),
            local_name!("textarea") | local_name!("title") => {
                TokenSinkResult::RawData(RawKind::Rcdata)
            }
            local_name!("plaintext") => TokenSinkResult::Plaintext,
            local_name!("svg") | local_name!("math") => {
                if !tag.self_closing {
                    let ns = if tag.name == local_name!("svg") {
                        Ns::Svg
                    } else {
                        Ns::MathMl
                    };
                    self.push_foreign(tag.name, ns);
                }
                return TokenSinkResult::Continue;
            }
            _ => TokenSinkResult::Continue,
        };
        // HTML elements are tracked until their end tag, so that the
        // current node is known inside an integration point, and an end
        // tag in foreign content can close an HTML element around it.
        // (`html`, `head` and `body` are never closed by an end tag in the
        // body, only left; table parts are dropped outside a table, and
        // tables are not followed.)
        if !is_void(&tag.name)
            && !matches!(
                &*tag.name,
                "html"
                    | "head"
                    | "body"
                    | "caption"
                    | "colgroup"
                    | "tbody"
                    | "td"
                    | "tfoot"
                    | "th"
                    | "thead"
                    | "tr"
            )
        {
            let open = match self.foreign.last_mut() {
                Some(top) => &mut top.html,
                None => &mut self.html,
            };
            open.push(tag.name);
        }
        result
    }

    fn end_tag(&mut self, tag: Tag) {
        if self.collecting && self.island_depth.is_none() {
            // In script data the only end tag the tokenizer gives is the
            // script's own.
            self.collecting = false;
        }
        let Some(top) = self.foreign.last_mut() else {
            self.html.close(&tag.name);
            return;
        };
        if !top.html.is_empty() {
            // An HTML end tag closes its element; an integration point is
            // never closed from inside by the HTML rules.
            top.html.close(&tag.name);
            return;
        }
        if matches!(&*tag.name, "br" | "p") {
            self.break_out();
            return;
        }
        if self.foreign_untracked > 0 {
            // Deeper than tracked: the end tag closes the innermost.
            self.foreign_untracked -= 1;
            return;
        }
        // From the current node down: a foreign element of that name is
        // closed; the first HTML elements below follow the HTML rules.
        let nearest = self.foreign.len().saturating_sub(END_TAG_SEARCH_DEPTH);
        for i in (nearest..self.foreign.len()).rev() {
            if self.foreign[i].name.eq_ignore_ascii_case(&tag.name) {
                self.truncate_foreign(i);
                return;
            }
            if i > 0 && !self.foreign[i - 1].html.is_empty() {
                if self.foreign[i - 1].html.close(&tag.name) {
                    self.truncate_foreign(i);
                }
                return;
            }
        }
        if nearest == 0 && self.html.close(&tag.name) {
            self.truncate_foreign(0);
        }
    }

    fn push_text(&mut self, text: &str) {
        if !self.collecting || self.too_large {
            return;
        }
        if self.text.len() + text.len() > MANIFEST_MAX_BYTES {
            self.too_large = true;
            self.text = String::new();
        } else {
            self.text.push_str(text);
        }
    }
}

impl TokenSink for IslandSink {
    type Handle = ();

    fn process_token(&mut self, token: Token, line: u64) -> TokenSinkResult<()> {
        let skip_newline = std::mem::take(&mut self.skip_newline);
        match token {
            Token::TagToken(tag) => match tag.kind {
                TagKind::StartTag => return self.start_tag(tag, line),
                TagKind::EndTag => self.end_tag(tag),
            },
            Token::CharacterTokens(text) => match text.strip_prefix('\n') {
                Some(rest) if skip_newline => self.push_text(rest),
                _ => self.push_text(&text),
            },
            // The tokenizer gives a bare NUL only in data; foreign content
            // keeps it as U+FFFD, HTML (and an integration point) drops it.
            Token::NullCharacterToken
                if self.in_foreign_node()
                    && self.foreign.last().is_some_and(|f| !f.integration_point()) =>
            {
                self.push_text("\u{fffd}")
            }
            Token::NullCharacterToken => {}
            Token::DoctypeToken(_)
            | Token::CommentToken(_)
            | Token::EOFToken
            | Token::ParseError(_) => {}
        }
        TokenSinkResult::Continue
    }

    fn adjusted_current_node_present_but_not_in_html_namespace(&self) -> bool {
        // CDATA sections are text only in foreign content.
        self.in_foreign_node()
    }
}
