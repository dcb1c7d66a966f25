import CPCRE2

/// A PCRE2 pattern compiled once (and JIT-compiled when the platform allows), matched with a
/// match limit so a catastrophic pattern fails in bounded time instead of stalling the loop.
/// Confined to the loop thread like everything in the engine (the match data is reused).
public final class TagRegex: @unchecked Sendable {
    private let code: OpaquePointer
    private let matchData: OpaquePointer
    private let context: OpaquePointer
    public let pattern: String
    public let ignoreCase: Bool

    /// Why a pattern did not compile.
    public struct CompileError: Error, CustomStringConvertible, Sendable {
        public let description: String
    }

    /// Result of one match: no match, a match (with group spans), or an error such as the
    /// match limit, which callers treat as "no match".
    public enum Outcome: Equatable {
        case noMatch
        case match
        case failed(String)
    }

    /// Compiles with `PCRE2_UTF` (and `PCRE2_CASELESS` for `ignoreCase`).
    public init(_ pattern: String, ignoreCase: Bool, limits: EngineLimits) throws(CompileError) {
        guard pattern.utf8.count <= limits.maxRegexPatternBytes else {
            throw CompileError(description: "pattern exceeds \(limits.maxRegexPatternBytes) bytes")
        }
        var err: Int32 = 0
        var offset = 0
        var opts = UInt32(PCRE2_UTF)
        if ignoreCase { opts |= UInt32(PCRE2_CASELESS) }
        var p = pattern
        let compiled = p.withUTF8 { b in
            b.withMemoryRebound(to: CChar.self) { pylon_pcre2_compile($0.baseAddress, $0.count, opts, &err, &offset) }
        }
        guard let compiled else {
            throw CompileError(description: "invalid regex at offset \(offset): \(TagRegex.message(err))")
        }
        _ = pylon_pcre2_jit_compile(compiled)  // best effort: the interpreter is the fallback
        guard let md = pylon_pcre2_match_data_create(compiled),
            let ctx = pylon_pcre2_match_context_create(limits.regexMatchLimit, limits.regexDepthLimit)
        else {
            pylon_pcre2_code_free(compiled)
            throw CompileError(description: "out of memory compiling regex")
        }
        code = compiled
        matchData = md
        context = ctx
        self.pattern = pattern
        self.ignoreCase = ignoreCase
    }

    deinit {
        pylon_pcre2_match_data_free(matchData)
        pylon_pcre2_match_context_free(context)
        pylon_pcre2_code_free(code)
    }

    /// Partial match: the pattern found anywhere in `subject` (`Matcher.find()`).
    public func matches(_ subject: String) -> Outcome {
        run(subject).outcome
    }

    /// The text of capture group `group` of the first match, or nil (no match, unset group,
    /// group out of range, error).
    public func group(_ group: Int, in subject: String) -> String? {
        let (outcome, count) = run(subject)
        guard outcome == .match, group >= 0, group < count else { return nil }
        guard let ov = pylon_pcre2_ovector(matchData) else { return nil }
        let start = ov[2 * group]
        let end = ov[2 * group + 1]
        guard start != pylon_pcre2_unset(), end >= start else { return nil }
        let bytes = Array(subject.utf8)
        return String(decoding: bytes[start..<end], as: UTF8.self)
    }

    private func run(_ subject: String) -> (outcome: Outcome, count: Int) {
        var s = subject
        let rc = s.withUTF8 { b in
            b.withMemoryRebound(to: CChar.self) { pylon_pcre2_match(code, $0.baseAddress, $0.count, matchData, context) }
        }
        if rc > 0 { return (.match, Int(rc)) }
        if rc == 0 { return (.match, 0) }  // ovector too small; the match itself stands
        if rc == PCRE2_ERROR_NOMATCH { return (.noMatch, 0) }
        return (.failed(TagRegex.message(rc)), 0)
    }

    static func message(_ code: Int32) -> String {
        var buf = [CChar](repeating: 0, count: 256)
        _ = pylon_pcre2_error_message(code, &buf, buf.count)
        return String(decoding: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
