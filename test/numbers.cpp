// numbers: the built-in corpus (data/numbers.h): known English and German number words, splits without
// overlap, the same corpus from the same seed, and out-of-range numbers refused.
#include <set>
#include <stdexcept>

#include "../data/numbers.h"
#include "check.h"

int main() {
  Checker ck("numbers");
  const struct { long n; const char *en, *de; } known[] = {
      {0, "zero", "null"},
      {1, "one", "eins"},
      {11, "eleven", "elf"},
      {16, "sixteen", "sechzehn"},
      {17, "seventeen", "siebzehn"},
      {21, "twenty-one", "einundzwanzig"},
      {30, "thirty", "dreißig"},
      {71, "seventy-one", "einundsiebzig"},
      {99, "ninety-nine", "neunundneunzig"},
      {100, "one hundred", "einhundert"},
      {101, "one hundred and one", "einhunderteins"},
      {324, "three hundred and twenty-four", "dreihundertvierundzwanzig"},
      {999, "nine hundred and ninety-nine", "neunhundertneunundneunzig"},
      {1000, "one thousand", "eintausend"},
      {1001, "one thousand and one", "eintausendeins"},
      {1100, "one thousand one hundred", "eintausendeinhundert"},
      {21000, "twenty-one thousand", "einundzwanzigtausend"},
      {100000, "one hundred thousand", "einhunderttausend"},
      {200001, "two hundred thousand and one", "zweihunderttausendeins"},
      {999999, "nine hundred and ninety-nine thousand nine hundred and ninety-nine",
       "neunhundertneunundneunzigtausendneunhundertneunundneunzig"},
  };
  for (const auto& k : known) {
    ck.expect(english_number(k.n) == k.en, "%ld in English: '%s', want '%s'", k.n, english_number(k.n).c_str(), k.en);
    ck.expect(german_number(k.n) == k.de, "%ld in German: '%s', want '%s'", k.n, german_number(k.n).c_str(), k.de);
  }
  for (long bad : {-1L, 1000000L}) {
    bool threw = false;
    try {
      english_number(bad);
    } catch (const std::out_of_range&) {
      threw = true;
    }
    ck.expect(threw, "%ld is refused", bad);
  }
  // every number has distinct words in both languages (the task is a function both ways)
  std::set<std::string> en, de;
  for (long n = 0; n <= 999999; ++n) en.insert(english_number(n)), de.insert(german_number(n));
  ck.expect(en.size() == 1000000 && de.size() == 1000000, "%zu English and %zu German spellings for 10^6 numbers", en.size(), de.size());

  NumberCorpus a = number_corpus(7, 5000, 500, 500), b = number_corpus(7, 5000, 500, 500), c = number_corpus(8, 5000, 500, 500);
  ck.expect(a.train.size() == 5000 && a.val.size() == 500 && a.test.size() == 500, "split sizes");
  std::set<long> seen;
  long small = 0;
  for (const auto* split : {&a.train, &a.val, &a.test})
    for (const NumberPair& p : *split) {
      ck.expect(seen.insert(p.n).second, "%ld appears twice across the splits", p.n);
      ck.expect(p.en == english_number(p.n) && p.de == german_number(p.n), "pair %ld is not its words", p.n);
      small += p.n < 100;
    }
  ck.expect(small == 100, "every number below 100 is drawn (lengths are drawn first): %ld of 100", small);
  bool same = a.train.size() == b.train.size(), differs = false;
  for (size_t i = 0; same && i < a.train.size(); ++i) same = a.train[i].n == b.train[i].n;
  for (size_t i = 0; i < a.train.size(); ++i) differs |= a.train[i].n != c.train[i].n;
  ck.expect(same, "the same seed gives the same corpus");
  ck.expect(differs, "another seed gives another corpus");
  return ck.finish();
}
