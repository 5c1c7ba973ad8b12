//! kiln's macros, checked when the user's crate compiles (re-exported by `kiln`; see its docs for examples).
//!
//! - `einsum!`: Einstein summation in nabla's index form, `einsum!((i, j) = a[i, k] * b[k, j])`, or PyTorch's
//!   string form, `einsum!("bij,bjk->bik", a, b)`. The subscripts are checked here: every output index appears in
//!   an operand, none twice in the output, as many operands as subscript groups, only letters and one `...`.
//!   Both expand to `kiln::Tensor::einsum`, whose size checks panic at the macro's line naming the index and
//!   both sizes. Where operands are typed (`kiln::Tensor2<784, 256>` and friends: dims as const generics), the
//!   expansion also asks the type system that a shared index has one size and that each typed operand has as many
//!   indices as dims, so a mismatch does not compile (`kiln::__private::SameSize`, whose diagnostic names both
//!   sizes); the subscripts of an operand with `...` are not checked this way.
//! - `fuse!(expr)`: the expression (elementwise ops, broadcasts, casts, movement, and at most one reduction as its
//!   last op) is guaranteed to run as one kernel. An op that cannot fuse into one (a matmul, a softmax, a gather, a
//!   reduction that is not last, a function call the macro cannot see into) is a compile error at its span saying
//!   why. At run time the operands are realized first and the expression is realized as one kernel; debug builds
//!   assert it (`kiln::__private::fused`).

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr, Token, bracketed, parenthesized};

/// Einstein summation checked at compile time; see the crate doc.
#[proc_macro]
pub fn einsum(input: TokenStream) -> TokenStream {
    match syn::parse::<Einsum>(input) {
        Ok(e) => e.expand().unwrap_or_else(|e| e.to_compile_error()).into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// One kernel, guaranteed at compile time; see the crate doc.
#[proc_macro]
pub fn fuse(input: TokenStream) -> TokenStream {
    let expr = syn::parse_macro_input!(input as Expr);
    let mut leaves = Vec::new();
    if let Err(e) = check_fusable(&expr, true, &mut leaves) {
        return e.to_compile_error().into();
    }
    // Each operand is probed for a tensor: `ViaTensor` applies to a `Tensor` or `&Tensor`, the autoref'd
    // `ViaOther` to anything else (a scalar, a dim), so no operand needs a type the macro cannot see.
    quote! {
        {
            #[allow(unused_imports)]
            use ::kiln::__private::{ViaOther as _, ViaTensor as _};
            let __kiln_operands: ::std::vec::Vec<::kiln::Tensor> =
                [#((&::kiln::__private::Probe(&(#leaves))).leaf()),*].into_iter().flatten().collect();
            ::kiln::__private::fused(&__kiln_operands, || #expr)
        }
    }
    .into()
}

/// The two input forms of `einsum!`.
enum Einsum {
    /// `"eq", a, b, ...`
    Text { eq: LitStr, operands: Vec<Expr> },
    /// `(i, j) = a[i, k] * b[k, j]`
    Index { out: Vec<Ident>, out_span: Span, factors: Vec<(Expr, Vec<Ident>)> },
}

impl Parse for Einsum {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(LitStr) {
            let eq: LitStr = input.parse()?;
            let mut operands = Vec::new();
            while !input.is_empty() {
                input.parse::<Token![,]>()?;
                if input.is_empty() {
                    break;
                }
                operands.push(input.parse()?);
            }
            return Ok(Einsum::Text { eq, operands });
        }
        let content;
        let paren = parenthesized!(content in input);
        let out: Punctuated<Ident, Token![,]> = content.parse_terminated(Ident::parse, Token![,])?;
        input.parse::<Token![=]>()?;
        let mut factors = Vec::new();
        loop {
            // An operand: a path or a parenthesized expression, then its indices in brackets.
            let operand: Expr = if input.peek(syn::token::Paren) {
                let inner;
                parenthesized!(inner in input);
                inner.parse()?
            } else {
                Expr::Path(input.parse()?)
            };
            let idx;
            bracketed!(idx in input);
            let indices: Punctuated<Ident, Token![,]> = idx.parse_terminated(Ident::parse, Token![,])?;
            factors.push((operand, indices.into_iter().collect()));
            if input.is_empty() {
                break;
            }
            input.parse::<Token![*]>()?;
        }
        Ok(Einsum::Index { out: out.into_iter().collect(), out_span: paren.span.join(), factors })
    }
}

impl Einsum {
    fn expand(self) -> syn::Result<Tokens> {
        // Each operand with its indices (name and span; `None` where a `...` leaves its axes unknown here).
        type Indexed = (Expr, Option<Vec<(String, Span)>>);
        let (eq, span, operands): (String, Span, Vec<Indexed>) = match self {
            Einsum::Text { eq, operands } => {
                check_equation(&eq.value(), operands.len(), eq.span())?;
                let text: String = eq.value().chars().filter(|c| !c.is_whitespace()).collect();
                let lhs = text.split("->").next().unwrap_or_default().to_string();
                let groups: Vec<&str> = lhs.split(',').collect();
                let indexed = operands
                    .into_iter()
                    .zip(&groups)
                    .map(|(o, g)| {
                        let letters =
                            (!g.contains('.')).then(|| g.chars().map(|c| (c.to_string(), eq.span())).collect());
                        (o, letters)
                    })
                    .collect();
                (eq.value(), eq.span(), indexed)
            }
            Einsum::Index { out, out_span, factors } => {
                // Index names to letters, in order of first appearance.
                let mut names: Vec<String> = Vec::new();
                let mut letter = |id: &Ident| -> syn::Result<char> {
                    let s = id.to_string();
                    let at = names.iter().position(|n| *n == s).unwrap_or_else(|| {
                        names.push(s);
                        names.len() - 1
                    });
                    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                        .get(at)
                        .map(|&c| c as char)
                        .ok_or_else(|| syn::Error::new(id.span(), "einsum!: more than 52 distinct indices"))
                };
                let mut terms = Vec::new();
                for (_, idx) in &factors {
                    terms.push(idx.iter().map(&mut letter).collect::<syn::Result<String>>()?);
                }
                for (j, id) in out.iter().enumerate() {
                    if out[..j].iter().any(|o| o == id) {
                        return Err(syn::Error::new(id.span(), format!("einsum!: output index `{id}` appears twice")));
                    }
                    if !factors.iter().any(|(_, idx)| idx.contains(id)) {
                        return Err(syn::Error::new(
                            id.span(),
                            format!("einsum!: output index `{id}` appears in no operand"),
                        ));
                    }
                }
                let rhs = out.iter().map(&mut letter).collect::<syn::Result<String>>()?;
                let indexed = factors
                    .into_iter()
                    .map(|(e, idx)| (e, Some(idx.iter().map(|i| (i.to_string(), i.span())).collect())))
                    .collect();
                (format!("{}->{rhs}", terms.join(",")), out_span, indexed)
            }
        };
        let lit = LitStr::new(&eq, span);
        let bound: Vec<Ident> = (0..operands.len()).map(|i| Ident::new(&format!("__kiln_operand{i}"), span)).collect();
        let lets = operands.iter().zip(&bound).map(|((o, _), b)| quote_spanned!(o.span()=> let #b = &(#o);));
        // Sizes checked by the type system: every typed operand's rank against its index count, and every later use
        // of an index against its first (`kiln::Tensor2` and friends; a plain `Tensor` agrees with any size here).
        let mut checks = Vec::new();
        let mut first: Vec<(String, usize, usize)> = Vec::new();
        for (k, (o, letters)) in operands.iter().enumerate() {
            let Some(letters) = letters else { continue };
            let (b, rank) = (&bound[k], letters.len());
            checks.push(
                quote_spanned!(o.span()=> ::kiln::__private::same_rank(::kiln::__private::rank_and::<#rank, _>(#b));),
            );
            for (axis, (name, at)) in letters.iter().enumerate() {
                match first.iter().find(|(n, _, _)| n == name) {
                    Some(&(_, k0, a0)) => {
                        let b0 = &bound[k0];
                        checks.push(quote_spanned!(*at=>
                            ::kiln::__private::same_size(::kiln::__private::axis_pair::<#a0, #axis, _, _>(#b0, #b));
                        ));
                    }
                    None => first.push((name.clone(), k, axis)),
                }
            }
        }
        Ok(quote_spanned! {span=> {
            #(#lets)*
            #(#checks)*
            ::kiln::Tensor::einsum(#lit, &[#(::kiln::__private::AsTensor::as_tensor(#bound)),*])
        }})
    }
}

/// The string form's checks: letters and one `...` per group, as many groups as operands, every output letter in
/// an operand and none twice.
fn check_equation(eq: &str, operands: usize, span: Span) -> syn::Result<()> {
    let err = |msg: String| Err(syn::Error::new(span, format!("einsum!: {msg}")));
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let groups: Vec<&str> = lhs.split(',').collect();
    if groups.len() != operands {
        return err(format!("'{eq}' has subscripts for {} operands, {operands} given", groups.len()));
    }
    let check_group = |g: &str| -> Result<(), String> {
        let rest = g.replacen("...", "", 1);
        if rest.contains('.') {
            return Err(format!("'{g}' has a '.' outside one '...'"));
        }
        match rest.chars().find(|c| !c.is_ascii_alphabetic()) {
            Some(c) => Err(format!("'{g}' has '{c}': subscripts are letters a-z, A-Z and one '...'")),
            None => Ok(()),
        }
    };
    for g in groups.iter().copied().chain(rhs) {
        if let Err(m) = check_group(g) {
            return err(m);
        }
    }
    if let Some(r) = rhs {
        let letters: Vec<char> = r.replacen("...", "", 1).chars().collect();
        for (j, c) in letters.iter().enumerate() {
            if letters[..j].contains(c) {
                return err(format!("output subscript {c} appears twice"));
            }
            if !lhs.contains(*c) {
                return err(format!("output subscript {c} appears in no operand"));
            }
        }
    }
    Ok(())
}

/// Methods `fuse!` takes: elementwise ops, comparisons, casts and movement (index math, never a copy).
const ELEMENTWISE: &[&str] = &[
    "neg",
    "exp",
    "log",
    "sin",
    "cos",
    "tan",
    "tanh",
    "sqrt",
    "rsqrt",
    "recip",
    "abs",
    "relu",
    "sigmoid",
    "silu",
    "square",
    "powf",
    "pow",
    "floor",
    "ceil",
    "round",
    "trunc",
    "sign",
    "log1p",
    "expm1",
    "exp2",
    "log2",
    "erf",
    "add",
    "sub",
    "mul",
    "div",
    "rem",
    "fmod",
    "remainder",
    "maximum",
    "minimum",
    "clamp",
    "where_",
    "lt",
    "le",
    "gt",
    "ge",
    "eq",
    "ne",
    "logical_and",
    "logical_or",
    "logical_not",
    "to_dtype",
    "reshape",
    "permute",
    "transpose",
    "t",
    "expand",
    "broadcast_to",
    "unsqueeze",
    "squeeze",
    "flatten",
    "narrow",
    "slice",
    "flip",
    "detach",
    "clone",
];

/// Reductions: `fuse!` takes one, as the expression's last op.
const REDUCTIONS: &[&str] = &["sum", "sum_all", "mean", "mean_all", "max", "min", "prod", "max_all", "min_all"];

/// Ops that do not fuse into one kernel with what surrounds them, and why.
const APART: &[(&str, &str)] = &[
    ("matmul", "a matmul runs as its own GEMM kernel (its epilogue can fuse, its operands are not recomputed)"),
    ("softmax", "softmax reduces a row twice (its max, then its sum) before the elementwise division"),
    ("log_softmax", "log_softmax reduces a row twice (its max, then its sum) before the subtraction"),
    ("gather", "a gather reads its source from a stored buffer at data-dependent places"),
    ("index_select", "an index_select reads its source from a stored buffer at data-dependent places"),
    ("contiguous", "contiguous() stores its value: an intermediate buffer"),
    ("cumsum", "cumsum is a scan, not an elementwise op"),
    ("sort", "sort is not an elementwise op"),
];

/// Checks that `e` fuses into one kernel: `root` is whether it is the expression's last op (where one reduction
/// may stand). Collects the leaves (variables and other operands) into `leaves`.
fn check_fusable(e: &Expr, root: bool, leaves: &mut Vec<Expr>) -> syn::Result<()> {
    match e {
        Expr::MethodCall(m) => {
            let name = m.method.to_string();
            if let Some((_, why)) = APART.iter().find(|(n, _)| *n == name) {
                return Err(syn::Error::new(m.method.span(), format!("fuse!: `{name}` cannot be fused: {why}")));
            }
            if REDUCTIONS.contains(&name.as_str()) {
                if !root {
                    return Err(syn::Error::new(
                        m.method.span(),
                        format!(
                            "fuse!: `{name}` is a reduction that feeds more work; fuse! takes at most one reduction, \
                             as the expression's last op"
                        ),
                    ));
                }
            } else if !ELEMENTWISE.contains(&name.as_str()) {
                return Err(syn::Error::new(
                    m.method.span(),
                    format!("fuse!: `{name}` is not an elementwise op, cast, movement or final reduction fuse! knows"),
                ));
            }
            check_fusable(&m.receiver, false, leaves)?;
            for a in &m.args {
                check_arg(a, leaves)?;
            }
            Ok(())
        }
        Expr::Binary(b) => {
            use syn::BinOp::*;
            if !matches!(b.op, Add(_) | Sub(_) | Mul(_) | Div(_)) {
                return Err(syn::Error::new(b.op.span(), "fuse!: only + - * / operators are taken"));
            }
            check_fusable(&b.left, false, leaves)?;
            check_fusable(&b.right, false, leaves)
        }
        Expr::Unary(u) => match u.op {
            syn::UnOp::Neg(_) => check_fusable(&u.expr, false, leaves),
            _ => Err(syn::Error::new(u.op.span(), "fuse!: only unary `-` is taken")),
        },
        Expr::Paren(p) => check_fusable(&p.expr, root, leaves),
        Expr::Reference(r) => check_fusable(&r.expr, root, leaves),
        Expr::Path(_) | Expr::Field(_) => {
            leaves.push(e.clone());
            Ok(())
        }
        Expr::Lit(_) => Ok(()),
        Expr::Call(c) => Err(syn::Error::new(
            c.func.span(),
            "fuse!: a function call is opaque to fuse!; write the expression with tensor methods and operators",
        )),
        other => Err(syn::Error::new(other.span(), "fuse!: not an expression fuse! can check")),
    }
}

/// A method argument: a literal, a scalar or tensor operand (checked as an expression), or a plain value (dims).
fn check_arg(a: &Expr, leaves: &mut Vec<Expr>) -> syn::Result<()> {
    match a {
        Expr::Lit(_) | Expr::Array(_) | Expr::Tuple(_) | Expr::Range(_) => Ok(()),
        Expr::Unary(u) if matches!(&*u.expr, Expr::Lit(_)) => Ok(()),
        _ => check_fusable(a, false, leaves),
    }
}
