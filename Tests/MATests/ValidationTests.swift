import PylonPluginKit
import Testing

@testable import pylon_ma

/// identifyAccount normalisation and eventRecord checks: one test per rule.
struct IdentityInputTests {
    @Test func trimsWhitespace() {
        #expect(IdentityInput(["userID": "  u1 \n"]).valid == ["user_id": "u1"])
    }

    @Test(arguments: ["", "0", "null", "NULL", "undefined", "Undefined", "nan", "NaN", "   "])
    func placeholderValuesCountAsNotSent(value: String) {
        let i = IdentityInput(["userID": .string(value), "email": "a@b.co"])
        #expect(i.valid["user_id"] == nil)
        #expect(i.rejected["user_id"] == nil, "no per-field result for a value that was not sent")
    }

    @Test func nonStringIs3013() {
        let i = IdentityInput(["userID": 42, "anonymousID": "a1"])
        #expect(i.rejected["user_id"]?.code == 3013)
        #expect(i.valid == ["anonymous_id": "a1"], "the other valid fields are still sent")
    }

    @Test func tooLongIs3003() {
        let i = IdentityInput(["userID": .string(String(repeating: "u", count: 257)), "phone": "+8613800000000"])
        #expect(i.rejected["user_id"]?.code == 3003)
        #expect(i.valid["phone"] == "+8613800000000")
    }

    @Test(arguments: ["plainaddress", "a@b", "@b.co", "a@.co", "a b@c.co", "a@b.co."])
    func badEmailIs3013(email: String) {
        #expect(IdentityInput(["email": .string(email)]).rejected["email"]?.code == 3013)
    }

    @Test func emailIsLowerCased() {
        #expect(IdentityInput(["email": " Ann@Example.COM "]).valid["email"] == "ann@example.com")
    }

    @Test(arguments: [("8613800000000", Int64(3013)), ("+12345", 3013), ("+86-138", 3013), ("+123456789012345678901", 3003)])
    func badPhone(phone: String, code: Int64) {
        #expect(IdentityInput(["phone": .string(phone)]).rejected["phone"]?.code == code)
    }

    @Test func messageMergesLocalAndServerResults() {
        let i = IdentityInput(["email": "a@b.co", "phone": "+123"])
        let m = i.message(server: ["email": ["code": 0]])
        let j = try? JSON.parse(m)
        #expect(j?["email"]?["code"] == .int(0))
        #expect(j?["phone"]?["code"] == .int(3013))
    }

    @Test func messageIsSuccessWhenNothingToReport() {
        #expect(IdentityInput(["userID": "u"]).message(server: nil) == "success")
    }

    @Test func noValidFieldLeavesNothingToSend() {
        #expect(IdentityInput(["userID": "null", "email": "bad"]).valid.isEmpty)
    }
}

struct EventValidationTests {
    @Test func validEventPasses() {
        #expect(EventValidation.check(eventName: "purchase", property: ["price": 10, "sku_id": "A1"]) == nil)
    }

    @Test func eventNameRules() {
        #expect(EventValidation.check(eventName: nil, property: nil) != nil)
        #expect(EventValidation.check(eventName: "", property: nil) != nil)
        #expect(EventValidation.check(eventName: "el_custom", property: nil)?.contains("el") == true)
        #expect(EventValidation.check(eventName: 5, property: nil) != nil)
    }

    @Test func propertyKeyRules() {
        #expect(EventValidation.check(eventName: "e", property: ["1abc": 1])?.contains("1abc") == true)
        #expect(EventValidation.check(eventName: "e", property: ["aBc": 1]) != nil)
        #expect(EventValidation.check(eventName: "e", property: ["a-b": 1]) != nil)
        #expect(EventValidation.check(eventName: "e", property: ["Abc": 1]) != nil, "keys hold lowercase letters only (ma.md §3)")
        #expect(EventValidation.check(eventName: "e", property: ["abc_1": 1]) == nil)
    }

    @Test func atMost500Properties() {
        var o = JSONObject()
        for i in 0..<501 { o["p\(i)"] = .int(Int64(i)) }
        #expect(EventValidation.check(eventName: "e", property: .object(o)) != nil)
        o["p500"] = nil
        #expect(EventValidation.check(eventName: "e", property: .object(o)) == nil)
    }

    @Test func stringsAtMost256Bytes() {
        #expect(EventValidation.check(eventName: "e", property: ["s": .string(String(repeating: "é", count: 129))]) != nil)
        #expect(EventValidation.check(eventName: "e", property: ["s": .string(String(repeating: "x", count: 256))]) == nil)
        #expect(EventValidation.check(eventName: .string(String(repeating: "e", count: 257)), property: nil) != nil)
    }
}
