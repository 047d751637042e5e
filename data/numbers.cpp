#include "numbers.h"

#include "../transformer.h"  // mix64

#include <stdexcept>
#include <unordered_set>

namespace {

const char* const kEnglishOnes[] = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                                    "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                                    "seventeen", "eighteen", "nineteen"};
const char* const kEnglishTens[] = {"", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"};
const char* const kGermanOnes[] = {"null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun",
                                   "zehn", "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn",
                                   "siebzehn", "achtzehn", "neunzehn"};
const char* const kGermanTens[] = {"", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig"};

std::string english_below_100(long n) {
  if (n < 20) return kEnglishOnes[n];
  return std::string(kEnglishTens[n / 10]) + (n % 10 ? std::string("-") + kEnglishOnes[n % 10] : "");
}

std::string english_below_1000(long n) {  // n >= 1
  if (n < 100) return english_below_100(n);
  return english_below_100(n / 100) + " hundred" + (n % 100 ? " and " + english_below_100(n % 100) : "");
}

// `last`: nothing follows, so 1 is "eins"; inside a word it is "ein"
std::string german_below_100(long n, bool last) {
  if (n == 1) return last ? "eins" : "ein";
  if (n < 20) return kGermanOnes[n];
  if (n % 10 == 0) return kGermanTens[n / 10];
  return (n % 10 == 1 ? std::string("ein") : kGermanOnes[n % 10]) + "und" + kGermanTens[n / 10];
}

std::string german_below_1000(long n, bool last) {  // n >= 1
  if (n < 100) return german_below_100(n, last);
  return german_below_100(n / 100, false) + "hundert" + (n % 100 ? german_below_100(n % 100, last) : "");
}

void check_range(long n) {
  if (n < 0 || n > 999999) throw std::out_of_range("number words cover 0 to 999,999, not " + std::to_string(n));
}

}  // namespace

std::string english_number(long n) {
  check_range(n);
  if (n == 0) return "zero";
  const long thousands = n / 1000, rest = n % 1000;
  std::string s;
  if (thousands) s = english_below_1000(thousands) + " thousand";
  if (rest) s += (s.empty() ? "" : rest < 100 ? " and " : " ") + english_below_1000(rest);
  return s;
}

std::string german_number(long n) {
  check_range(n);
  if (n == 0) return "null";
  const long thousands = n / 1000, rest = n % 1000;
  std::string s;
  if (thousands) s = german_below_1000(thousands, false) + "tausend";
  if (rest) s += german_below_1000(rest, true);
  return s;
}

NumberCorpus number_corpus(uint64_t seed, int train, int val, int test) {
  if (train < 0 || val < 0 || test < 0 || (long)train + val + test > 500000)
    throw std::invalid_argument("number corpus: split sizes must be >= 0 and at most 500,000 together");
  uint64_t counter = mix64(seed);
  auto next = [&]() { return mix64(counter++); };  // the same numbers on every platform
  static const long kFirst[] = {0, 10, 100, 1000, 10000, 100000}, kCount[] = {10, 90, 900, 9000, 90000, 900000};
  std::unordered_set<long> used;
  NumberCorpus c;
  for (auto [split, size] : {std::pair{&c.train, train}, std::pair{&c.val, val}, std::pair{&c.test, test}})
    while ((int)split->size() < size) {
      const int digits = (int)(next() % 6);
      const long n = kFirst[digits] + (long)(next() % kCount[digits]);
      if (used.insert(n).second) split->push_back({n, english_number(n), german_number(n)});
    }
  return c;
}
