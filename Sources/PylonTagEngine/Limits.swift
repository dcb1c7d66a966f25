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
    /// Bytes an evaluation may produce and hash in all (template and joiner output, string
    /// forms compared or matched, `_hsh`/`_enc` input): the work bound that steps alone are not
    /// (one step can copy or hash a 1 MiB string). Past it the evaluation stops
    /// (`EvaluationStop.workBytes`).
    public var maxWorkBytes = 8 << 20
    /// Largest value an evaluation may answer, as JSON text (a `getValue` value, a tag's
    /// properties, a function call's parameters): larger is `EvaluationStop.valueBytes`. Keep it
    /// under a quarter of the host's `maxLineBytes` (a string answer is escaped once more).
    public var maxValueBytes = 256 << 10

    public init() {}
}
