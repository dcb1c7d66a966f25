import PylonCore

/// Random JSON text for the differential tests of the byte readers against json-c (the backend's
/// batch bodies, the uploader's enqueues, MA's events): whitespace, strings with escapes, numbers
/// json-c reads but prints differently, nested values with repeated and escaped keys. Each test
/// sets its own `Odds`; the draws come in a fixed order, so a seed always gives the same text
/// (the tests' counts of which reader answered depend on it).
public struct RandomJSONText {
    public struct Odds: Sendable {
        /// Out of 100: no whitespace at a place that may have some.
        public var plainSpacePercent: Int
        /// Out of 100: a string's next piece is an escape json-c rewrites.
        public var escapePercent: Int
        /// A string's other pieces.
        public var plainChars: [String]
        /// Out of 100: a number json-c prints differently (`oddNumbers`) rather than as written.
        public var oddNumberPercent: Int
        public var oddNumbers: [String]
        public var plainNumbers: [String]
        /// An object has up to `maxKeys - 1` members named `k0`…; out of 100, a member repeats the
        /// first key, or spells one with an escape.
        public var maxKeys: Int
        public var keyNames: Int
        public var repeatKeyPercent: Int
        public var escapedKeyPercent: Int
        /// A string length limit to test around (strings and keys near it), or nil.
        public var lengthLimit: Int?
        /// Out of 100, with `lengthLimit`: a key just past it.
        public var longKeyPercent = 0

        public init(
            plainSpacePercent: Int, escapePercent: Int, plainChars: [String], oddNumberPercent: Int, oddNumbers: [String],
            plainNumbers: [String], maxKeys: Int, keyNames: Int, repeatKeyPercent: Int, escapedKeyPercent: Int
        ) {
            self.plainSpacePercent = plainSpacePercent
            self.escapePercent = escapePercent
            self.plainChars = plainChars
            self.oddNumberPercent = oddNumberPercent
            self.oddNumbers = oddNumbers
            self.plainNumbers = plainNumbers
            self.maxKeys = maxKeys
            self.keyNames = keyNames
            self.repeatKeyPercent = repeatKeyPercent
            self.escapedKeyPercent = escapedKeyPercent
        }
    }

    /// Escapes json-c reads and prints otherwise (`\/`, `\u00e9`, a surrogate pair, NUL).
    public static let escapes = [#"\/"#, #"\u00e9"#, #"\u0041"#, #"\ud83d\ude00"#, #"\u0000"#]
    /// Numbers json-c reads and prints otherwise or not at all (`-0`, beyond Int64).
    public static let oddNumbers = ["-0", "9223372036854775808", "-9223372036854775809", "123456789012345678901"]
    public static let plainNumbers = ["0", "7", "-12", "9.99", "1e5", "-0.0", "2.50e-3", "9223372036854775807", "1732900000"]

    public var rng: SplitMix64
    public let odds: Odds

    public init(seed: UInt64, odds: Odds) {
        rng = SplitMix64(seed: seed)
        self.odds = odds
    }

    public mutating func int(_ n: Int) -> Int { Int(rng.next() % UInt64(n)) }
    public mutating func chance(_ percent: Int) -> Bool { int(100) < percent }
    public mutating func pick(_ options: [String]) -> String { options[int(options.count)] }
    public mutating func space() -> String { chance(odds.plainSpacePercent) ? "" : pick([" ", "\n", "\t ", "  "]) }
    /// Fisher-Yates with this generator's draws.
    public mutating func shuffle(_ a: inout [String]) {
        for i in stride(from: a.count - 1, to: 0, by: -1) { a.swapAt(i, int(i + 1)) }
    }

    /// A string's text between its quotes: up to five pieces, or (with `lengthLimit`) one of
    /// three strings around the limit.
    public mutating func stringBody() -> String {
        if let limit = odds.lengthLimit {
            switch int(12) {
            case 0: return String(repeating: "a", count: limit - 1 + int(3))
            case 1: return String(repeating: "é", count: limit / 2 - 1 + int(3))
            case 2: return String(repeating: "b", count: limit - 6 + int(3)) + String(repeating: #"\n"#, count: 3 + int(3))
            default: break
            }
        }
        var s = ""
        for _ in 0..<int(6) { s += chance(odds.escapePercent) ? pick(Self.escapes) : pick(odds.plainChars) }
        return s
    }

    public mutating func number() -> String { chance(odds.oddNumberPercent) ? pick(odds.oddNumbers) : pick(odds.plainNumbers) }

    /// Any value, nested at most three levels.
    public mutating func value(depth: Int = 0) -> String {
        switch int(depth > 2 ? 3 : 6) {
        case 0: return "\"" + stringBody() + "\""
        case 1: return number()
        case 2: return pick(["true", "false", "null"])
        case 3, 4:
            var keys: [String] = []
            for _ in 0..<int(odds.maxKeys) { keys.append(key(after: keys)) }
            return "{" + keys.map { space() + $0 + space() + ":" + space() + value(depth: depth + 1) + space() }.joined(separator: ",")
                + "}"
        default:
            return "[" + (0..<int(4)).map { _ in space() + value(depth: depth + 1) + space() }.joined(separator: ",") + "]"
        }
    }

    /// An object's next key: sometimes the first one again, an escaped spelling, or one past the
    /// length limit.
    private mutating func key(after keys: [String]) -> String {
        if chance(odds.repeatKeyPercent) && !keys.isEmpty { return keys[0] }
        if chance(odds.escapedKeyPercent) { return #""k\u0065y""# }
        if let limit = odds.lengthLimit, odds.longKeyPercent > 0, chance(odds.longKeyPercent) {
            return "\"" + String(repeating: "k", count: limit + int(2)) + "\""
        }
        return "\"k\(int(odds.keyNames))\""
    }
}
