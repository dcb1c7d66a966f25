import PylonCore

/// The value types `gtm.getValue` can ask for.
public enum ValueType: String, Sendable, CaseIterable {
    case string, bool, double, int64

    /// The type default: `""`, `false`, `0.0`, `0`.
    public var defaultValue: JSON {
        switch self {
        case .string: return .string("")
        case .bool: return .bool(false)
        case .double: return .double(0)
        case .int64: return .int(0)
        }
    }
}

/// The legacy SDK's type conversions (`Types.java`). `nil` is an unresolved value.
///
/// | to | from |
/// |---|---|
/// | string | strings as they are; integers in decimal; doubles in shortest round-trip form (`1.5`, `2.0`); booleans `true`/`false`; lists and maps as JSON; unresolved/null → `""` |
/// | bool | booleans; strings `true`/`false` in any case; anything else → `false` |
/// | double | numbers; strings parsed; anything else → `0.0` and a warning |
/// | int64 | integers; doubles truncated toward zero; strings parsed as integers, else as doubles and truncated; anything else → `0` |
public enum TagConversion {
    public static func convert(_ v: JSON?, to type: ValueType, warn: (String) -> Void = { _ in }) -> JSON {
        switch type {
        case .string: return .string(toString(v))
        case .bool: return .bool(toBool(v))
        case .double:
            if let d = toDouble(v) { return .double(d) }
            if let v { warn("Failed to convert '\(toString(v).prefix(64))' to a number.") }
            return .double(0)
        case .int64: return .int(toInt64(v) ?? 0)
        }
    }

    public static func toString(_ v: JSON?) -> String {
        guard let v else { return "" }
        switch v {
        case .null: return ""
        case .array, .object: return v.serialized
        default: return v.scalarString ?? ""
        }
    }

    public static func toBool(_ v: JSON?) -> Bool {
        switch v {
        case .bool(let b)?: return b
        case .string(let s)?: return s.lowercased() == "true"
        default: return false
        }
    }

    public static func toDouble(_ v: JSON?) -> Double? {
        switch v {
        case .int(let i)?: return Double(i)
        case .double(let d)?: return d
        case .string(let s)?: return parseNumber(s)?.double
        default: return nil
        }
    }

    public static func toInt64(_ v: JSON?) -> Int64? {
        switch v {
        case .int(let i)?: return i
        case .double(let d)?: return truncate(d)
        case .string(let s)?:
            switch parseNumber(s) {
            case .int(let i)?: return i
            case .double(let d)?: return truncate(d)
            case nil: return nil
            }
        default: return nil
        }
    }

    static func truncate(_ d: Double) -> Int64? {
        guard d.isFinite else { return nil }
        if d >= 9.2e18 { return Int64.max }
        if d <= -9.2e18 { return Int64.min }
        return Int64(d.rounded(.towardZero))
    }

    /// A typed number: int64 when the text is an integer, else double.
    public enum Number: Equatable, Sendable {
        case int(Int64)
        case double(Double)
        var double: Double {
            switch self {
            case .int(let i): return Double(i)
            case .double(let d): return d
            }
        }
    }

    /// Parses a decimal integer or a floating-point number (surrounding whitespace allowed;
    /// `nan`/`inf` rejected).
    public static func parseNumber(_ s: String) -> Number? {
        let t = s.trimmingWhitespace
        guard !t.isEmpty, t.utf8.count <= 64 else { return nil }
        if let i = Int64(t) { return .int(i) }
        guard t.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2E || $0 == 0x2B || $0 == 0x2D || $0 == 0x65 || $0 == 0x45 }),
            let d = Double(t), d.isFinite
        else { return nil }
        return .double(d)
    }

    /// A number as JSON value (for numeric predicates).
    public static func number(_ v: JSON?) -> Number? {
        switch v {
        case .int(let i)?: return .int(i)
        case .double(let d)?: return d.isFinite ? .double(d) : nil
        case .string(let s)?: return parseNumber(s)
        default: return nil
        }
    }

    /// The length of `v` as JSON text, or an upper bound of it (numbers count their widest
    /// form, every `/` and control byte its escape), nil as soon as it passes `limit`: the walk
    /// stops there, so it costs O(limit) whatever `v` holds.
    public static func jsonSize(_ v: JSON, limit: Int) -> Int? {
        var total = 0
        func add(_ s: String) -> Bool {
            total += s.utf8.count + 2
            if total > limit { return false }
            for b in s.utf8 where b < 0x20 || b == 0x22 || b == 0x5C || b == 0x2F || b == 0x7F { total += 5 }
            return total <= limit
        }
        func walk(_ v: JSON) -> Bool {
            switch v {
            case .null, .bool: total += 5
            case .int, .double: total += 24
            case .string(let s): return add(s)
            case .array(let a):
                total += 2 + a.count
                if total > limit { return false }
                for x in a where !walk(x) { return false }
            case .object(let o):
                total += 2 + 2 * o.count
                if total > limit { return false }
                for (k, x) in o {
                    if !add(k) || !walk(x) { return false }
                }
            }
            return total <= limit
        }
        return walk(v) ? total : nil
    }

    /// Shortest round-trip text of a double (Swift's `description`: `1.5`, `2.0`, `1e+20`).
    static func doubleText(_ d: Double) -> String { d.description }
}

extension String {
    var trimmingWhitespace: String {
        let ws: (Character) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" }
        guard let a = firstIndex(where: { !ws($0) }), let b = lastIndex(where: { !ws($0) }) else { return "" }
        return String(self[a...b])
    }
}
