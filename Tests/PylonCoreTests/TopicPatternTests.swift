import Testing

@testable import PylonCore

struct TopicPatternTests {
    @Test(arguments: [
        ("push.*", "push.message", true),
        ("push.*", "push.", true),
        ("push.*", "pushx.message", false),
        ("*", "anything.at.all", true),
        ("*.changed", "consent.changed", true),
        ("*.changed", "consent.changedx", false),
        ("a.*.c", "a.b.c", true),
        ("a.*.c", "a.b.d", false),
        ("exact", "exact", true),
        ("exact", "exactly", false),
        ("a*b*c", "aXbYc", true),
        ("a*b*c", "acb", false),
    ])
    func matches(pattern: String, topic: String, expected: Bool) {
        #expect(TopicPattern(pattern).matches(topic) == expected)
    }
}
