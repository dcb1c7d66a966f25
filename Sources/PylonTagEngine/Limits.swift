/// Every bound the engine applies to one container or one evaluation. A container comes from
/// the network, so none of its contents may crash the plugin or hold its loop: each limit
/// turns into the type default plus one warning, never a trap.
public struct EngineLimits: Sendable, Equatable {
    /// Macro references followed inside one evaluation before giving up (a chain, not a cycle).
    public var maxDepth = 32
    /// Work units (expression nodes, predicates, rules, macros) per evaluation.
    public var maxSteps = 200_000
    /// PCRE2 match limit (backtracking steps per match): a catastrophic pattern fails fast.
    public var regexMatchLimit: UInt32 = 100_000
    /// PCRE2 depth limit (the interpreter's backtracking depth; JIT ignores it).
    public var regexDepthLimit: UInt32 = 1_000
    /// Longest subject a regex is run on (bytes); longer subjects make the predicate false.
    public var maxRegexSubjectBytes = 64 * 1024
    /// Longest pattern compiled (bytes).
    public var maxRegexPatternBytes = 4 * 1024
    /// Entries per container section (macros, predicates, tags, rules).
    public var maxEntries = 100_000
    /// Warnings kept per evaluation (the rest are counted).
    public var maxWarnings = 32
    /// Longest string a template or joiner builds (bytes); longer output is cut.
    public var maxStringBytes = 1 << 20

    public init() {}
}
