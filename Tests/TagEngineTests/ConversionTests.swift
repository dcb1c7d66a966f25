import PylonCore
import Testing

@testable import PylonTagEngine

@Suite struct ConversionTests {
    func conv(_ v: JSON?, _ t: ValueType) -> JSON { TagConversion.convert(v, to: t) }

    @Test func toString() {
        #expect(conv("abc", .string) == "abc")
        #expect(conv(42, .string) == "42")
        #expect(conv(-7, .string) == "-7")
        #expect(conv(1.5, .string) == "1.5")
        #expect(conv(2.0, .string) == "2.0")
        #expect(conv(true, .string) == "true")
        #expect(conv(false, .string) == "false")
        #expect(conv(["a", 1], .string) == "[\"a\",1]")
        #expect(conv(["k": "v"], .string) == "{\"k\":\"v\"}")
        #expect(conv(nil, .string) == "")
        #expect(conv(.null, .string) == "")
    }

    @Test func toBool() {
        #expect(conv(true, .bool) == true)
        #expect(conv(false, .bool) == false)
        #expect(conv("true", .bool) == true)
        #expect(conv("TRUE", .bool) == true)
        #expect(conv("False", .bool) == false)
        #expect(conv("1", .bool) == false)
        #expect(conv("yes", .bool) == false)
        #expect(conv(1, .bool) == false)
        #expect(conv(nil, .bool) == false)
    }

    @Test func toDouble() {
        #expect(conv(3, .double) == .double(3))
        #expect(conv(2.5, .double) == 2.5)
        #expect(conv("2.5", .double) == 2.5)
        #expect(conv(" 10 ", .double) == 10.0)
        #expect(conv("1e3", .double) == 1000.0)
        var warned = ""
        #expect(TagConversion.convert("abc", to: .double) { warned = $0 } == 0.0)
        #expect(warned == "Failed to convert 'abc' to a number.")
        #expect(conv(true, .double) == 0.0)
        #expect(conv(nil, .double) == 0.0)
        #expect(conv("nan", .double) == 0.0)
    }

    @Test func toInt64() {
        #expect(conv(7, .int64) == 7)
        #expect(conv(7.9, .int64) == 7)
        #expect(conv(-7.9, .int64) == -7)
        #expect(conv("12", .int64) == 12)
        #expect(conv("12.75", .int64) == 12, "a decimal string is truncated")
        #expect(conv("x", .int64) == 0)
        #expect(conv(true, .int64) == 0)
        #expect(conv(nil, .int64) == 0)
        #expect(conv("9223372036854775807", .int64) == .int(Int64.max))
        #expect(conv(1e300, .int64) == .int(Int64.max))
    }

    @Test func typeDefaults() {
        #expect(ValueType.string.defaultValue == "")
        #expect(ValueType.bool.defaultValue == false)
        #expect(ValueType.double.defaultValue == .double(0))
        #expect(ValueType.int64.defaultValue == 0)
    }
}

@Suite struct ContainerFormTests {
    @Test func plainContainerIsConstants() throws {
        let c = try Container.plain(["title": "Hello", "n": 3, "nested": ["a": [1, 2]]])
        #expect(value(c, "title") == "Hello")
        #expect(value(c, "n") == 3)
        #expect(value(c, "nested") == ["a": [1, 2]])
    }

    @Test func plainContainerRejectsArraysAndNullAtTopLevel() {
        #expect(throws: ContainerError.self) { try Container.plain([1, 2]) }
        #expect(throws: ContainerError.self) { try Container.plain(.null) }
        do { _ = try Container.plain(["a": [1]]); Issue.record("accepted") } catch {
            #expect(error.description.contains("\"a\" is an array"))
        }
        do { _ = try Container.plain(["a": .null]); Issue.record("accepted") } catch {
            #expect(error.description.contains("null"))
        }
    }

    @Test func fullContainerTextWithOrWithoutResourceWrapper() throws {
        let a = try Container.parse(text: #"{"resource":{"version":"3","macros":[{"function":"_c","instance_name":"k","value":"v"}]}}"#)
        let b = try Container.parse(text: #"{"version":3,"macros":[{"function":"_c","instance_name":"k","value":"v"}]}"#)
        #expect(a.version == "3" && b.version == "3")
        #expect(value(a, "k") == "v" && value(b, "k") == "v")
        #expect(throws: ContainerError.self) { try Container.parse(text: "[1]") }
        #expect(throws: ContainerError.self) { try Container.parse(text: "{\"macros\": 3}") }
        #expect(throws: ContainerError.self) { try Container.parse(text: "not json") }
    }
}
