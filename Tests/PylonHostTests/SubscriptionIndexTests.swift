import PylonCore
import Testing

@testable import PylonHost

/// Topic patterns → subscribers without peers: exact topics, `*` anywhere in a pattern, several
/// subscribers per pattern, several matching patterns per subscriber (delivered once), removal.
struct SubscriptionIndexTests {
    @Test func exactPatternsMatchTheirTopicOnly() {
        var x = SubscriptionIndex<Int>()
        x.add(TopicPattern("app.news"), 1)
        x.add(TopicPattern("app.news"), 2)
        #expect(x.subscribers(of: "app.news") == [1, 2])
        #expect(x.subscribers(of: "app.newsflash").isEmpty)
        #expect(x.subscribers(of: "app").isEmpty)
        #expect(x.patternCount == 1, "one pattern however many subscribers")
    }

    @Test func wildcardsMatchAsTopicPatternDoes() {
        var x = SubscriptionIndex<Int>()
        x.add(TopicPattern("bus.*"), 1)
        x.add(TopicPattern("*.changed"), 2)
        x.add(TopicPattern("*"), 3)
        x.add(TopicPattern("ma.*.done"), 4)
        #expect(x.subscribers(of: "bus.plugin.exited") == [1, 3])
        #expect(x.subscribers(of: "consent.changed") == [2, 3])
        #expect(x.subscribers(of: "bus.changed") == [1, 2, 3])
        #expect(x.subscribers(of: "ma.upload.done") == [3, 4])
        #expect(x.subscribers(of: "ma.done") == [3], "the * between two dots needs the dots")
        // The index agrees with TopicPattern on every pair.
        let patterns = ["bus.*", "*.changed", "*", "ma.*.done", "a*a", "x"]
        for topic in ["bus.x", "a", "aa", "aXa", "x", "ma..done", "consent.changed", "xy"] {
            var y = SubscriptionIndex<Int>()
            for (i, p) in patterns.enumerated() { y.add(TopicPattern(p), i) }
            let expected = Set(patterns.indices.filter { TopicPattern(patterns[$0]).matches(topic) })
            #expect(y.subscribers(of: topic) == expected, "\(topic)")
            for i in patterns.indices { #expect(y.isSubscribed(i, to: topic) == expected.contains(i), "\(topic) \(i)") }
        }
    }

    @Test func aSubscriberMatchingTwiceIsListedOnce() {
        var x = SubscriptionIndex<Int>()
        x.add(TopicPattern("app.news"), 1)
        x.add(TopicPattern("app.*"), 1)
        x.add(TopicPattern("*"), 1)
        #expect(x.subscribers(of: "app.news") == [1])
    }

    @Test func removalLeavesOtherSubscribersAndDropsEmptyPatterns() {
        var x = SubscriptionIndex<Int>()
        let news = TopicPattern("app.news"), all = TopicPattern("app.*")
        x.add(news, 1)
        x.add(all, 1)
        x.add(all, 2)
        x.remove(news, 1)
        #expect(x.subscribers(of: "app.news") == [1, 2], "still through app.*")
        x.remove(1, from: [news, all])
        #expect(x.subscribers(of: "app.news") == [2])
        x.remove(all, 3)  // never added: no effect
        x.remove(TopicPattern("zzz"), 2)
        #expect(x.subscribers(of: "app.x") == [2])
        x.remove(all, 2)
        #expect(x.isEmpty && x.patternCount == 0)
    }
}
