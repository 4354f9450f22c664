// What the playground says in each language a model may speak: the Speak view's sample text
// (offered when a voice of that language is picked and the text is still a sample) and the
// Clone view's prompts, one sentence per take (English's are clone.js' PROMPTS).

export const SAMPLES = {
  en: "Hello there. This is voicehost, speaking as it streams.",
  fr: "Bonjour. Ici voicehost, qui parle à mesure que sa voix se crée.",
  de: "Hallo. Hier spricht voicehost, während die Stimme entsteht.",
  es: "Hola. Aquí habla voicehost, mientras su voz se genera.",
  it: "Ciao. Qui parla voicehost, mentre la sua voce prende forma.",
  ko: "안녕하세요. 저는 voicehost입니다. 만들어지는 대로 말합니다.",
  hi: "नमस्ते। यह voicehost है, जो आवाज़ बनते ही बोलता है।",
  zh: "你好。这里是 voicehost，声音一边生成一边播放。",
};

export const PROMPTS_BY_LANGUAGE = {
  fr: [
    "Le petit chat dort sur le canapé bleu.",
    "Nous avons pris le train de huit heures pour Lyon.",
    "Il fait beau, alors allons marcher près de la rivière.",
    "La boulangerie ouvre très tôt le dimanche matin.",
    "Mon frère joue de la guitare depuis dix ans.",
    "Ferme la fenêtre, le vent souffle fort ce soir.",
    "Elle a acheté des pommes, des poires et du fromage.",
    "Le musée est fermé le mardi toute la journée.",
    "Pourriez-vous répéter la question plus lentement ?",
    "Les enfants chantent dans la cour de l'école.",
  ],
  de: [
    "Der kleine Hund schläft unter dem Küchentisch.",
    "Wir fahren morgen früh mit dem Zug nach Hamburg.",
    "Im Sommer schwimmen wir gern im kühlen See.",
    "Die Bäckerei öffnet jeden Tag um sechs Uhr.",
    "Mein Bruder spielt seit zehn Jahren Klavier.",
    "Schließ bitte das Fenster, es zieht kalt herein.",
    "Sie hat Äpfel, Birnen und frisches Brot gekauft.",
    "Das Museum ist montags den ganzen Tag geschlossen.",
    "Könnten Sie die Frage bitte langsamer wiederholen?",
    "Die Kinder singen laut auf dem Schulhof.",
  ],
  es: [
    "El gato pequeño duerme sobre el sofá azul.",
    "Mañana tomaremos el tren de las ocho a Sevilla.",
    "Hace buen tiempo, así que vamos a caminar por el río.",
    "La panadería abre muy temprano los domingos.",
    "Mi hermano toca la guitarra desde hace diez años.",
    "Cierra la ventana, que el viento sopla fuerte.",
    "Ella compró manzanas, peras y un poco de queso.",
    "El museo cierra los lunes durante todo el día.",
    "¿Podría repetir la pregunta más despacio?",
    "Los niños cantan en el patio de la escuela.",
  ],
  it: [
    "Il piccolo gatto dorme sul divano azzurro.",
    "Domani prendiamo il treno delle otto per Firenze.",
    "Fa bel tempo, quindi andiamo a camminare lungo il fiume.",
    "Il panificio apre molto presto la domenica.",
    "Mio fratello suona la chitarra da dieci anni.",
    "Chiudi la finestra, il vento soffia forte stasera.",
    "Lei ha comprato mele, pere e un po' di formaggio.",
    "Il museo è chiuso il lunedì per tutto il giorno.",
    "Potrebbe ripetere la domanda più lentamente?",
    "I bambini cantano nel cortile della scuola.",
  ],
  ko: [
    "작은 고양이가 파란 소파 위에서 자고 있어요.",
    "우리는 내일 아침 여덟 시 기차를 탑니다.",
    "날씨가 좋으니까 강가를 걸어요.",
    "빵집은 일요일 아침에 아주 일찍 문을 열어요.",
    "제 동생은 십 년 동안 기타를 쳤어요.",
    "창문을 닫아 주세요. 오늘 밤은 바람이 세요.",
    "그녀는 사과와 배와 치즈를 샀어요.",
    "박물관은 월요일에 하루 종일 닫혀 있어요.",
    "질문을 조금 더 천천히 말해 주시겠어요?",
    "아이들이 학교 운동장에서 노래를 불러요.",
  ],
  hi: [
    "छोटी बिल्ली नीले सोफ़े पर सो रही है।",
    "हम कल सुबह आठ बजे की ट्रेन पकड़ेंगे।",
    "मौसम अच्छा है, चलो नदी के किनारे टहलते हैं।",
    "बेकरी रविवार को बहुत जल्दी खुलती है।",
    "मेरा भाई दस साल से गिटार बजाता है।",
    "खिड़की बंद कर दो, आज रात हवा तेज़ है।",
    "उसने सेब, नाशपाती और थोड़ा पनीर खरीदा।",
    "संग्रहालय सोमवार को पूरे दिन बंद रहता है।",
    "क्या आप सवाल थोड़ा धीरे दोहरा सकते हैं?",
    "बच्चे स्कूल के आँगन में गाना गा रहे हैं।",
  ],
  zh: [
    "小猫在蓝色的沙发上睡觉。",
    "我们明天早上坐八点的火车去上海。",
    "天气很好，我们去河边散步吧。",
    "面包店星期天很早就开门。",
    "我哥哥弹吉他已经十年了。",
    "请把窗户关上，今晚风很大。",
    "她买了苹果、梨和一些奶酪。",
    "博物馆星期一全天关闭。",
    "你能再慢一点重复这个问题吗？",
    "孩子们在学校的操场上唱歌。",
  ],
};

// The primary subtag of a BCP-47 tag: "en-US" -> "en".
export function primary(language) {
  return String(language || "en").split("-")[0].toLowerCase();
}

export function sampleFor(language) {
  return SAMPLES[primary(language)] || SAMPLES.en;
}

export function isSample(text) {
  return Object.values(SAMPLES).includes(text.trim());
}
