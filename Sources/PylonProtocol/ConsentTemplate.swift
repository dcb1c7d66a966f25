/// A method's consent template (`ma:{appKey}`, `{consent}`), taken apart once, so a request is
/// resolved without scanning the template text (the router keeps one per manifest method;
/// `Manifest.Method.consentKey` builds one per call).
///
/// `key(field:)`: literal text and `{field}` values joined; `.unresolved` when a field is absent
/// or empty; the template itself when it has no `{`, or a `{` without a closing `}` after the
/// fields before it resolved. Braces are found by `Character`, so a combining mark after a brace
/// makes it another character.
public struct ConsentTemplate: Sendable {
    enum Piece: Sendable, Equatable {
        case literal(Substring)
        case field(String)
    }

    private enum Form: Sendable {
        /// No template: not data collection.
        case none
        /// No field: the template is the key.
        case fixed(String)
        /// Literals and fields, in order; `unclosed`: a `{` without `}` follows them, and the
        /// key is then the template as written.
        case pieces([Piece], unclosed: Bool, template: String)
    }

    private let form: Form

    public init(_ template: String?) {
        guard let t = template else { form = .none; return }
        guard t.contains("{") else { form = .fixed(t); return }
        var pieces: [Piece] = []
        var rest = t[...]
        while let open = rest.firstIndex(of: "{") {
            if open > rest.startIndex { pieces.append(.literal(rest[..<open])) }
            guard let close = rest[open...].firstIndex(of: "}") else {
                form = .pieces(pieces, unclosed: true, template: t)
                return
            }
            pieces.append(.field(String(rest[rest.index(after: open)..<close])))
            rest = rest[rest.index(after: close)...]
        }
        if !rest.isEmpty { pieces.append(.literal(rest)) }
        form = .pieces(pieces, unclosed: false, template: t)
    }

    /// The switch a request falls under, reading each `{field}` through `field` (a top-level
    /// params string, nil when absent or not a string).
    public func key(field: (String) -> String?) -> ConsentKey {
        switch form {
        case .none: return .none
        case .fixed(let k): return .key(k)
        case .pieces(let pieces, let unclosed, let template):
            // The common template is one field (`{consent}`): its value is the key.
            if pieces.count == 1, case .field(let name) = pieces[0], !unclosed {
                guard let v = field(name), !v.isEmpty else { return .unresolved }
                return .key(v)
            }
            var out = ""
            for p in pieces {
                switch p {
                case .literal(let s): out += s
                case .field(let name):
                    guard let v = field(name), !v.isEmpty else { return .unresolved }
                    out += v
                }
            }
            return .key(unclosed ? template : out)
        }
    }
}
